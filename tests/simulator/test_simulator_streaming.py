"""Streaming (SSE) as SGLang 0.5.23 frames it (`serving_chat.py` `_generate_chat_stream`, `sse_utils.py`):
the 200 with the first output, a role chunk, separate reasoning and content deltas, the finish chunk
with matched_stop, then the sglext chunk (speculative details and the exact ids) and the usage chunk,
then [DONE]; a client that goes away aborts its request."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from inference.simulator import EOS_TOKEN_ID, SimulatorProcess, SimulatorSettings, predict_outcome
from tests.simulator.test_simulator_scheduler import (
    poll_until,
    running_and_queued,
    sample_value,
    send_in_background,
)
from tests.support.simulator_client import make_client, user

HEADERS_WAIT_S = 0.5  # a queued request behind a minute-long one: far longer than this
LONG_TOKENS = 10_000  # about a minute at real speed (170 tokens/s alone)
# SGLang's StreamDelta omits `role` and `content` when None and always writes `reasoning_content`
ROLE_DELTA = {"reasoning_content": None, "role": "assistant", "content": ""}
FINISH_DELTA = {"reasoning_content": None}


def delta_text(chunks: list[Any], field: str) -> str:
    return "".join(
        (
            (chunk.choices[0].delta.model_extra or {}).get(field)
            if field == "reasoning_content"
            else chunk.choices[0].delta.content
        )
        or ""
        for chunk in chunks
        if chunk.choices
    )


def raw_events(sim: SimulatorProcess, body: dict[str, Any]) -> list[str]:
    with httpx.stream(
        "POST", sim.base_url + "/chat/completions", json={**body, "stream": True}, timeout=10
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def test_a_stream_without_include_usage_carries_no_usage_and_the_same_text(
    client: openai.OpenAI, fast_settings: SimulatorSettings
) -> None:
    messages = user("Stream me.")
    expected = predict_outcome(fast_settings, messages)

    chunks = list(client.chat.completions.create(model="default", messages=messages, stream=True))

    assert all(chunk.usage is None for chunk in chunks)
    assert delta_text(chunks, "reasoning_content") == expected.reasoning_content
    assert delta_text(chunks, "content") == expected.content
    final = chunks[-1].choices[0]
    assert final.finish_reason == "stop" and (final.model_extra or {})["matched_stop"] == EOS_TOKEN_ID


def test_a_stream_with_include_usage_ends_with_a_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="default",
            messages=user("usage"),
            max_tokens=25,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 25
    assert (last.usage.model_extra or {})["reasoning_tokens"] == 25
    assert chunks[-2].choices[0].finish_reason == "length"


def test_the_raw_stream_is_framed_like_sglang(
    simulator: SimulatorProcess, fast_settings: SimulatorSettings
) -> None:
    messages = user("frames")
    expected = predict_outcome(fast_settings, messages)
    assert expected.finish_reason == "stop" and expected.content, "the prompt must think, then answer"

    events = raw_events(
        simulator,
        {
            "messages": messages,
            "rid": "stream-rid",
            "return_spec_tokens_details": True,
            "return_input_ids_in_sglext": True,
            "return_output_ids_in_sglext": True,
            "stream_options": {"include_usage": True},
        },
    )

    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["id"] for chunk in chunks} == {"stream-rid"}
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    role, *deltas, finish, sglext, usage = chunks
    # the role chunk, then reasoning deltas, then content deltas, never both in one chunk
    assert role["choices"][0]["delta"] == ROLE_DELTA and "usage" not in role
    kinds = [set(chunk["choices"][0]["delta"]) for chunk in deltas]
    assert kinds == sorted(kinds, key=len) and {frozenset(kind) for kind in kinds} == {
        frozenset({"reasoning_content"}),
        frozenset({"reasoning_content", "content"}),
    }
    reasoning_deltas = [
        chunk["choices"][0]["delta"] for chunk in deltas if len(chunk["choices"][0]["delta"]) == 1
    ]
    content_deltas = [
        chunk["choices"][0]["delta"] for chunk in deltas if len(chunk["choices"][0]["delta"]) == 2
    ]
    assert "".join(delta["reasoning_content"] for delta in reasoning_deltas) == expected.reasoning_content
    assert all(delta["reasoning_content"] is None for delta in content_deltas)
    assert "".join(delta["content"] for delta in content_deltas) == expected.content
    # the finish chunk: an empty delta, the finish reason and the EOS token that stopped it
    [finish_choice] = finish["choices"]
    assert finish_choice["delta"] == FINISH_DELTA
    assert (finish_choice["finish_reason"], finish_choice["matched_stop"]) == ("stop", EOS_TOKEN_ID)
    # the sglext chunk (pydantic writes usage: null), then the usage chunk (no sglext key)
    assert sglext["choices"] == [] and sglext["usage"] is None
    assert set(sglext["sglext"]) == {"spec_tokens_details", "input_ids", "output_ids"}
    assert usage["choices"] == [] and "sglext" not in usage
    assert len(sglext["sglext"]["input_ids"]) == usage["usage"]["prompt_tokens"] == expected.prompt_tokens
    [output_ids] = sglext["sglext"]["output_ids"]
    assert output_ids[-1] == EOS_TOKEN_ID
    assert len(output_ids) == usage["usage"]["completion_tokens"] == expected.completion_tokens


def test_without_the_id_flags_the_sglext_chunk_carries_only_the_speculative_details(
    simulator: SimulatorProcess,
) -> None:
    events = raw_events(
        simulator,
        {"messages": user("no ids"), "max_tokens": 300, "return_spec_tokens_details": True},
    )

    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert set(chunks[-1]["sglext"]) == {"spec_tokens_details"}


def test_stream_reasoning_false_sends_the_reasoning_in_one_piece(
    simulator: SimulatorProcess, fast_settings: SimulatorSettings
) -> None:
    messages = user("one piece")
    expected = predict_outcome(fast_settings, messages)

    events = raw_events(simulator, {"messages": messages, "stream_reasoning": False})

    deltas = [json.loads(event)["choices"][0]["delta"] for event in events[1:-1]]
    reasoning = [delta["reasoning_content"] for delta in deltas if delta["reasoning_content"]]
    assert reasoning == [expected.reasoning_content]
    assert "".join(delta.get("content") or "" for delta in deltas) == expected.content


def test_a_queued_stream_gets_its_200_only_with_its_first_output(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given one slot at real speed, taken by a minute-long request
    sim = start_simulator(max_running_requests=1, speedup=1.0)
    with make_client(sim) as client:
        call = send_in_background(client, max_tokens=LONG_TOKENS, text="holds the slot")
        poll_until(lambda: running_and_queued(sim) == (1, 0))
        # When a stream waits in the queue behind it, no answer has started: not even the headers
        with (
            pytest.raises(httpx.ReadTimeout),
            httpx.stream(
                "POST",
                sim.base_url + "/chat/completions",
                json={"messages": user("queued"), "stream": True},
                timeout=HEADERS_WAIT_S,
            ),
        ):
            pass
        httpx.post(sim.url + "/abort_request", json={"abort_all": True}, timeout=10)
        call.join(timeout=10)
    assert call.result is not None and call.result.choices[0].finish_reason == "abort"


def test_a_stream_whose_client_goes_away_is_aborted_and_its_slot_freed_at_once(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a long stream at real speed that has started
    sim = start_simulator(speedup=1.0, enable_metrics=True)
    with httpx.stream(
        "POST",
        sim.base_url + "/chat/completions",
        json={"messages": user("goes away"), "max_tokens": LONG_TOKENS, "stream": True, "rid": "leaves"},
        timeout=10,
    ) as response:
        lines = response.iter_lines()  # kept: a dropped line iterator closes the connection
        assert json.loads(next(lines).removeprefix("data: "))["choices"][0]["delta"] == ROLE_DELTA
        assert running_and_queued(sim) == (1, 0)
    # When the client closes the connection, then the server aborts the request and frees its slot
    poll_until(lambda: running_and_queued(sim) == (0, 0) and len(sim.admin.requests(rid="leaves")) == 1)
    [record] = sim.admin.requests(rid="leaves")
    assert record.status == "cancelled" and 0 < record.completion_tokens < LONG_TOKENS
    metrics = httpx.get(sim.url + "/metrics", timeout=10).text
    assert sample_value(metrics, "sglang:num_aborted_requests_total") == 1
