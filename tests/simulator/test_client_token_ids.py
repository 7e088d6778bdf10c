"""The worker's client asks every request for its token ids and keeps them with the completion; a
server that does not return them (SGLang before 0.5.23) still gives a completion, without ids."""

from __future__ import annotations

import asyncio

from core.records import Message, SamplingSettings
from inference.chat_stream import ChatResult
from inference.client import SGLangClient
from inference.client_settings import ClientSettings
from inference.server_facts import facts_from_server_info
from inference.server_probe import ServerProbe
from inference.simulator import SimulatorProcess
from tests.support import sse

BUDGET = 4096
USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13, "reasoning_tokens": 2}


def older_server() -> sse.Answer:
    """A stream without the trailing sglext chunk of ids, as from SGLang before 0.5.23."""
    return sse.event_stream(
        sse.chunk({"role": "assistant", "content": "", "reasoning_content": None}),
        sse.chunk({"reasoning_content": "thought\n"}),
        sse.chunk({"reasoning_content": None, "content": "\n\nanswer"}),
        sse.chunk({"reasoning_content": None}, finish_reason="stop"),
        sse.chunk(usage=USAGE),
        sse.DONE,
    )


def chat(server_url: str) -> ChatResult:
    async def ask() -> ChatResult:
        client = SGLangClient(ClientSettings(server_url=server_url))
        try:
            messages = [Message(role="user", content="why is the sky blue")]
            return await client.chat(messages, SamplingSettings(max_tokens=BUDGET), rid="run:p1:0")
        finally:
            await client.close()

    return asyncio.run(ask())


def test_every_completion_carries_the_ids_the_server_tokenized_and_sampled(
    simulator: SimulatorProcess,
) -> None:
    result = chat(simulator.url)
    assert result.prompt_token_ids is not None and result.response_token_ids is not None
    assert len(result.prompt_token_ids) == result.usage.prompt_tokens
    assert len(result.response_token_ids) == result.usage.completion_tokens


def test_a_server_without_token_ids_still_gives_a_completion_without_them() -> None:
    with sse.serving(older_server()) as server:
        result = chat(server.url)
    assert result.content == "\n\nanswer"
    assert result.prompt_token_ids is None and result.response_token_ids is None


def test_the_servers_facts_name_its_version_model_and_speculative_settings(
    simulator: SimulatorProcess,
) -> None:
    info = ServerProbe(simulator.url).server_info()
    assert info is not None
    facts = facts_from_server_info(info, simulator.url)
    assert facts.version == "0.5.23"
    assert facts.model_path and facts.context_length and facts.speculative_num_draft_tokens
    assert facts.speculative_algorithm is not None
