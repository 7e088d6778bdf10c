"""The only I/O of preflight: send the prompts, read `/server_info`, then build the report."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

from core.records import SamplingSettings
from inference.client import SGLangClient
from inference.client_settings import DEFAULT_REQUEST_TIMEOUT_S, ClientSettings
from inference.errors import InferenceError
from inference.server_probe import ServerProbe
from node.preflight.outcomes import (
    PromptOutcome,
    ServerReading,
    outcome_of_error,
    outcome_of_result,
    server_reading,
)
from node.preflight.prompts import PreflightPrompt
from node.preflight.report import PreflightReport, build_report

SERVER_INFO_TIMEOUT_S = 10.0
RID_PREFIX = "preflight"


async def fetch_server_info(
    url: str, api_key: str | None, timeout_s: float = SERVER_INFO_TIMEOUT_S
) -> ServerReading:
    """`/server_info`, read after the prompts so its average accept length covers them."""
    try:
        payload = await asyncio.to_thread(ServerProbe(url, api_key).read_server_info, timeout_s)
    except InferenceError as error:
        return ServerReading(error=str(error))
    return server_reading(payload)


async def _ask(
    client: SGLangClient, prompt: PreflightPrompt, sampling: SamplingSettings, rid: str
) -> PromptOutcome:
    try:
        result = await client.chat(prompt.messages, sampling, rid)
    except InferenceError as error:
        return outcome_of_error(prompt.name, error)
    return outcome_of_result(prompt.name, result, thinking_enabled=sampling.enable_thinking)


async def run_preflight(
    url: str,
    prompts: Sequence[PreflightPrompt],
    sampling: SamplingSettings,
    *,
    api_key: str | None = None,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> PreflightReport:
    """Send every prompt at once with `sampling`, then read `/server_info`, then judge."""
    client = SGLangClient(
        ClientSettings(server_url=url, api_key=api_key, request_timeout_s=request_timeout_s)
    )
    batch = uuid.uuid4().hex[:12]
    try:
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(
                _ask(client, prompt, sampling, f"{RID_PREFIX}-{batch}-{index}")
                for index, prompt in enumerate(prompts)
            )
        )
        wall_s = time.monotonic() - started
    finally:
        await client.close()
    server = await fetch_server_info(url, api_key)
    return build_report(url, sampling, outcomes, server, wall_s)
