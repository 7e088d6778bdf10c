"""The SGLang client reads the server's context length, and a budget retry against the simulator
stays inside it (the simulator refuses, as SGLang does, what does not fit with its reserved tokens)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from core.records import Origin, Quality, SamplingSettings
from core.run_settings.model import DEFAULT_RETRY_MAX_TOKENS_CAP, TruncationPolicy
from inference.client import SGLangClient
from inference.client_settings import ClientSettings
from inference.errors import InferenceUnavailable
from inference.simulator import SimulatorProcess
from tests.support import sse
from tests.support.handover import Recorder
from tests.support.records import prompt
from workers.generate.generation import CONTEXT_HEADROOM_TOKENS, GenerationEngine, RetryPolicy, Truncation

SERVE_CONTEXT_TOKENS = 40_960  # the README's `serve --context-length`
SMALL_CONTEXT_TOKENS = 2_048  # small enough for a whole retry ladder to run in a moment
FIRST_BUDGET = 512
ENDLESS_THINKING_MEAN_TOKENS = 1_000_000.0  # every answer is cut off in thinking
WINDOW = 4
SERVER_ERROR = 503


def context_length(server_url: str) -> int | None:
    async def ask() -> int | None:
        client = SGLangClient(ClientSettings(server_url=server_url))
        try:
            return await client.context_length()
        finally:
            await client.close()

    return asyncio.run(ask())


def test_the_client_reads_the_simulator_s_context_length(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(context_length=SERVE_CONTEXT_TOKENS)
    assert context_length(sim.url) == SERVE_CONTEXT_TOKENS


def test_a_server_that_does_not_state_its_context_gives_none() -> None:
    no_field = {"object": "list", "data": [{"id": "m", "object": "model"}]}
    with sse.serving(sse.json_answer(404, {"detail": "Not Found"})) as no_route:
        assert context_length(no_route.url) is None
    with sse.serving(sse.json_answer(200, no_field)) as server:
        assert context_length(server.url) is None


def test_a_server_that_cannot_answer_now_is_unavailable_not_silent() -> None:
    busy = sse.json_answer(SERVER_ERROR, {"object": "error", "message": "busy"})
    with sse.serving(busy) as server, pytest.raises(InferenceUnavailable, match="HTTP 503: busy"):
        context_length(server.url)


def test_a_budget_retry_against_the_simulator_stops_at_what_its_context_leaves_and_is_not_refused(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a simulator with a small context whose model thinks past any budget
    sim = start_simulator(
        context_length=SMALL_CONTEXT_TOKENS, thinking_tokens_mean=ENDLESS_THINKING_MEAN_TOKENS
    )
    engine = GenerationEngine(
        lambda: SGLangClient(ClientSettings(server_url=sim.url)),
        max_in_flight=WINDOW,
        retry=RetryPolicy(max_attempts=1, backoff_base_s=0.0, backoff_cap_s=0.0),
        origin=Origin(host="h", gpu=0, server_url=sim.url),
    )
    recorder = Recorder()
    try:
        # When a run retrying truncated thinking generates a prompt
        outcome = engine.submit_batch(
            "r",
            [prompt("long")],
            SamplingSettings(max_tokens=FIRST_BUDGET),
            recorder,
            Truncation(TruncationPolicy.RETRY, DEFAULT_RETRY_MAX_TOKENS_CAP),
        ).outcome()
    finally:
        engine.close()
    # Then the budget doubled once, then took what the context leaves, and the server took it
    assert (outcome.staged, outcome.dead_lettered) == (1, 0)
    (kept,) = recorder.staged
    fits = SMALL_CONTEXT_TOKENS - kept.usage.prompt_tokens - CONTEXT_HEADROOM_TOKENS
    assert (kept.quality, kept.sampling.max_tokens, kept.budget_retries) == (
        Quality.TRUNCATED_IN_THINKING,
        fits,
        2,
    )
    assert kept.usage.completion_tokens == fits
