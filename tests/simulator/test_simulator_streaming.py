"""Streaming (SSE) as SGLang frames it: role chunk, separate reasoning/content deltas, finish chunk,
optional sglext and usage chunks, then [DONE]."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from inference.simulator import EOS_TOKEN_ID, SimulatorProcess, SimulatorSettings, predict_outcome
from tests.support.simulator_client import user


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


def test_the_raw_stream_is_framed_like_sglang(simulator: SimulatorProcess) -> None:
    events = raw_events(
        simulator,
        {
            "messages": user("frames"),
            "max_tokens": 300,
            "rid": "stream-rid",
            "return_spec_tokens_details": True,
            "stream_options": {"include_usage": True},
        },
    )

    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["id"] for chunk in chunks} == {"stream-rid"}
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "reasoning_content": None}
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks[1:] if chunk["choices"]]
    # reasoning and content never share a chunk, and reasoning_content is always written
    assert all("reasoning_content" in delta for delta in deltas)
    assert not any(delta["content"] and delta["reasoning_content"] for delta in deltas)
    finish = chunks[-3]["choices"][0]
    assert finish["finish_reason"] == "length" and finish["delta"]["content"] is None
    assert chunks[-2]["choices"] == [] and "spec_tokens_details" in chunks[-2]["sglext"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 300


def test_stream_reasoning_false_sends_the_reasoning_in_one_piece(
    simulator: SimulatorProcess, fast_settings: SimulatorSettings
) -> None:
    messages = user("one piece")
    expected = predict_outcome(fast_settings, messages)

    events = raw_events(simulator, {"messages": messages, "stream_reasoning": False})

    deltas = [json.loads(event)["choices"][0]["delta"] for event in events[1:-1]]
    reasoning = [delta["reasoning_content"] for delta in deltas if delta["reasoning_content"]]
    assert reasoning == [expected.reasoning_content]
    assert "".join(delta["content"] or "" for delta in deltas) == expected.content
