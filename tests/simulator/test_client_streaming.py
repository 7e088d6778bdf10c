"""The client streams every completion and adds it up to the result a non-streamed request gives, the
exact ids included; each chunk is a sign of life; failures in the stream keep the error tree."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from core.records import Message, SamplingSettings, Usage
from inference.chat_stream import ChatResult
from inference.client import SGLangClient
from inference.client_settings import ClientSettings
from inference.errors import FailureCause, InferenceRejected, InferenceUnavailable
from inference.simulator import SimulatorProcess, SimulatorSettings, predict_outcome
from tests.simulator.test_simulator_scheduler import poll_until, running_and_queued
from tests.support import sse
from tests.support.simulator_client import make_client

QUESTION = "why is the sky blue"
LONG_TOKENS = 10_000  # about a minute at real speed
SHORT_TIMEOUT_S = 0.5
SERVICE_UNAVAILABLE = 503
BAD_REQUEST = 400


def messages(text: str = QUESTION) -> list[Message]:
    return [Message(role="user", content=text)]


def streamed(
    server_url: str,
    sampling: SamplingSettings,
    *,
    text: str = QUESTION,
    timeout_s: float | None = None,
) -> ChatResult:
    async def ask() -> ChatResult:
        settings = ClientSettings(server_url=server_url)
        if timeout_s is not None:
            settings = ClientSettings(server_url=server_url, request_timeout_s=timeout_s)
        client = SGLangClient(settings)
        try:
            return await client.chat(messages(text), sampling, rid=f"streamed:{text}:{sampling.max_tokens}")
        finally:
            await client.close()

    return asyncio.run(ask())


def not_streamed(sim: SimulatorProcess, sampling: SamplingSettings, text: str = QUESTION) -> ChatResult:
    """The same request as the client's, answered in one body with the choice's token ids."""
    with make_client(sim) as client:
        response = client.chat.completions.create(
            model=sampling.model,
            messages=[{"role": "user", "content": text}],
            max_completion_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            extra_body={
                "top_k": sampling.top_k,
                "min_p": sampling.min_p,
                "chat_template_kwargs": {"enable_thinking": sampling.enable_thinking},
                "return_spec_tokens_details": True,
                "return_token_ids": True,
            },
        )
    [choice] = response.choices
    usage = response.usage
    assert usage is not None
    extras: dict[str, Any] = choice.model_extra or {}
    sglext = (response.model_extra or {}).get("sglext") or {}
    details = sglext.get("spec_tokens_details")
    return ChatResult(
        content=choice.message.content or "",
        reasoning_content=(choice.message.model_extra or {}).get("reasoning_content"),
        finish_reason=str(choice.finish_reason),
        usage=Usage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            reasoning_tokens=(usage.model_extra or {})["reasoning_tokens"],
        ),
        spec_accept_length=details["spec_accept_length"] if details else None,
        started_at=0.0,
        finished_at=0.0,
        prompt_token_ids=extras.get("prompt_token_ids"),
        response_token_ids=extras.get("response_token_ids"),
    )


def without_times(result: ChatResult) -> ChatResult:
    return msgspec.structs.replace(result, started_at=0.0, finished_at=0.0)


def budgets(settings: SimulatorSettings) -> dict[str, SamplingSettings]:
    """A budget for each outcome the quality labels tell apart, from what the simulator will draw."""
    outcome = predict_outcome(settings, [{"role": "user", "content": QUESTION}])
    assert outcome.finish_reason == "stop" and outcome.answer_tokens > 2
    return {
        "answered": SamplingSettings(max_tokens=4 * outcome.completion_tokens),
        "cut inside thinking": SamplingSettings(max_tokens=outcome.thinking_tokens // 2),
        "cut inside the answer": SamplingSettings(
            max_tokens=outcome.thinking_tokens + outcome.answer_tokens // 2
        ),
        "thinking off": SamplingSettings(max_tokens=4 * outcome.completion_tokens, enable_thinking=False),
    }


@pytest.mark.parametrize("case", ["answered", "cut inside thinking", "cut inside the answer", "thinking off"])
def test_a_streamed_completion_adds_up_to_the_non_streamed_one_ids_included(
    simulator: SimulatorProcess, fast_settings: SimulatorSettings, case: str
) -> None:
    sampling = budgets(fast_settings)[case]

    result = streamed(simulator.url, sampling)

    assert without_times(result) == not_streamed(simulator, sampling)
    assert result.prompt_token_ids is not None and result.response_token_ids is not None
    assert len(result.response_token_ids) == result.usage.completion_tokens
    assert result.started_at <= result.finished_at


def test_the_stream_s_chunks_are_signs_of_life_and_cancelling_aborts_the_request_at_the_server(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a minute-long request at real speed
    sim = start_simulator(speedup=1.0)

    async def watch_then_cancel() -> bool:
        client = SGLangClient(ClientSettings(server_url=sim.url))
        progressed = asyncio.Event()
        try:
            call = asyncio.ensure_future(
                client.chat(messages(), SamplingSettings(max_tokens=LONG_TOKENS), "alive", progressed.set)
            )
            # When its first chunks arrive, the caller hears of them while the request still runs
            await progressed.wait()
            still_running = not call.done()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            return still_running
        finally:
            await client.close()

    assert asyncio.run(watch_then_cancel())
    # And cancelling the call closes its connection: the server aborts the request and frees the slot
    poll_until(lambda: running_and_queued(sim) == (0, 0) and len(sim.admin.requests(rid="alive")) == 1)
    assert sim.admin.requests(rid="alive")[0].status == "cancelled"


def test_a_request_longer_than_the_request_timeout_is_cut_though_its_stream_never_pauses(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(speedup=1.0)
    with pytest.raises(InferenceUnavailable, match="request timeout") as raised:
        streamed(sim.url, SamplingSettings(max_tokens=LONG_TOKENS), timeout_s=SHORT_TIMEOUT_S)
    assert raised.value.cause is FailureCause.TIMED_OUT


def test_a_stream_dropped_half_way_is_unavailable_and_says_dropped(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(drop_rate=1.0)
    with pytest.raises(InferenceUnavailable) as raised:
        streamed(sim.url, SamplingSettings(max_tokens=200))
    assert raised.value.cause is FailureCause.DROPPED and raised.value.server_unreachable


def test_an_error_before_the_stream_keeps_its_status(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(error_rate=1.0, error_status=SERVICE_UNAVAILABLE)
    with pytest.raises(InferenceUnavailable) as unavailable:
        streamed(sim.url, SamplingSettings(max_tokens=200))
    assert (unavailable.value.status, unavailable.value.cause) == (SERVICE_UNAVAILABLE, FailureCause.HTTP)
    with pytest.raises(InferenceRejected) as rejected:
        streamed(sim.url, SamplingSettings(max_tokens=sim.settings.context_length + 1))
    assert rejected.value.status == BAD_REQUEST


ROLE = sse.chunk({"reasoning_content": None, "role": "assistant", "content": ""})
THOUGHT = sse.chunk({"reasoning_content": "a first thought"})
USAGE = sse.chunk(
    usage={"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12, "reasoning_tokens": 3}
)


@pytest.mark.parametrize(
    ("code", "expected"), [(SERVICE_UNAVAILABLE, InferenceUnavailable), (BAD_REQUEST, InferenceRejected)]
)
def test_an_error_event_in_the_middle_of_a_stream_keeps_the_error_tree(
    code: int, expected: type[Exception]
) -> None:
    # SGLang's mid-stream error (an abort with a status), then its usage chunk and [DONE]
    error = {
        "error": {"object": "error", "message": "out of memory", "type": "X", "param": None, "code": code}
    }
    with (
        sse.serving(sse.event_stream(ROLE, THOUGHT, error, USAGE, sse.DONE)) as server,
        pytest.raises(expected, match="out of memory") as raised,
    ):
        streamed(server.url, SamplingSettings(max_tokens=200))

    assert getattr(raised.value, "status", None) == code
    if isinstance(raised.value, InferenceUnavailable):
        assert raised.value.cause is FailureCause.HTTP and not raised.value.server_unreachable


def test_a_stream_that_ends_without_a_finish_reason_is_unavailable() -> None:
    with (
        sse.serving(sse.event_stream(ROLE, THOUGHT)) as server,
        pytest.raises(InferenceUnavailable, match="without a finish reason") as raised,
    ):
        streamed(server.url, SamplingSettings(max_tokens=200))
    assert raised.value.cause is FailureCause.DROPPED


def test_a_stream_that_ends_without_its_usage_is_unavailable() -> None:
    finish = sse.chunk({"reasoning_content": None}, finish_reason="length")
    with (
        sse.serving(sse.event_stream(ROLE, THOUGHT, finish, sse.DONE)) as server,
        pytest.raises(InferenceUnavailable, match="usage") as raised,
    ):
        streamed(server.url, SamplingSettings(max_tokens=200))
    assert raised.value.cause is FailureCause.MALFORMED


def test_the_request_asks_for_a_stream_with_usage_and_the_ids_in_sglext_never_return_token_ids() -> None:
    finish = sse.chunk({"reasoning_content": None}, finish_reason="stop")
    with sse.serving(sse.event_stream(ROLE, finish, USAGE, sse.DONE)) as server:
        streamed(server.url, SamplingSettings(max_tokens=200))

    [seen] = server.requests
    assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
    body = json.loads(seen.body)
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})
    assert body["return_input_ids_in_sglext"] is body["return_output_ids_in_sglext"] is True
    assert body["return_spec_tokens_details"] is True
    assert not {"return_token_ids", "return_prompt_token_ids", "return_meta_info"} & set(body)
