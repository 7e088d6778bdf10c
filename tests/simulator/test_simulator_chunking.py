"""SGLang's stream chunking (`output_streamer.py`): a chunk after every decode step, carrying the
tokens that step produced (with MTP about the accept length, 3.5), the first token at once; with
--stream-interval N a chunk whenever at least N tokens are unsent. `--stream-chunking step` sends every
such chunk at any speedup; the default (wall) merges those closer than the write interval, which at
real speed (a step longer than the interval) leaves every chunk its own."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import httpx
import pytest

from inference.simulator import SimulatorProcess

OUTPUT_TOKENS = 200
REAL_SPEED_OUTPUT_TOKENS = 40
SLOW_STEP_S = 0.1  # a step 10 x the write interval: a late wake-up does not merge two steps
ACCEPT_LENGTH = 3.5  # the default: tokens per request per decode step
STREAM_INTERVAL = 8


def content_chunk_tokens(sim: SimulatorProcess, output_tokens: int = OUTPUT_TOKENS) -> list[int]:
    """Tokens (filler words, one token each) carried by each content chunk of one streamed answer."""
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Count the chunks."}],
        "max_tokens": output_tokens,
        "ignore_eos": True,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with httpx.stream("POST", sim.base_url + "/chat/completions", json=body, timeout=30) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    texts = [event["choices"][0]["delta"].get("content") for event in events if event["choices"]]
    return [len(text.split()) for text in texts if text]


def test_a_stream_sends_a_chunk_per_decode_step_with_the_tokens_it_accepted(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(stream_chunking="step")  # speedup 1000: the chunks are a real server's

    chunks = content_chunk_tokens(sim)

    decode_steps = math.ceil((OUTPUT_TOKENS - 1) / ACCEPT_LENGTH)
    assert sum(chunks) == OUTPUT_TOKENS
    assert chunks[0] == 1  # the prefill's token, at once
    assert len(chunks) == 1 + decode_steps
    assert set(chunks[1:-1]) == {3, 4}  # 3.5 on average: a draft accepted or not
    assert sum(chunks[1:]) / decode_steps == pytest.approx(ACCEPT_LENGTH, abs=0.1)


def test_the_stream_interval_holds_tokens_back_until_that_many_are_unsent(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(stream_chunking="step", stream_interval=STREAM_INTERVAL)

    chunks = content_chunk_tokens(sim)

    assert sum(chunks) == OUTPUT_TOKENS
    assert chunks[0] == 1
    # whole steps: the first step after which at least 8 tokens wait, 3 steps of 3 or 4 tokens
    assert set(chunks[1:-1]) == {10, 11}
    assert chunks[-1] <= 11


def test_at_real_speed_the_default_chunking_is_sglangs(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(speedup=1.0, decode_step_base_s=SLOW_STEP_S)

    chunks = content_chunk_tokens(sim, REAL_SPEED_OUTPUT_TOKENS)

    assert chunks[0] == 1
    assert len(chunks) == 1 + math.ceil((REAL_SPEED_OUTPUT_TOKENS - 1) / ACCEPT_LENGTH)
    assert sum(chunks) == REAL_SPEED_OUTPUT_TOKENS


def test_at_a_high_speedup_the_default_chunking_merges_the_steps_of_one_write(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator()  # speedup 1000: a write interval of 10 ms spans many decode steps

    chunks = content_chunk_tokens(sim)

    assert sum(chunks) == OUTPUT_TOKENS
    assert len(chunks) < math.ceil(OUTPUT_TOKENS / ACCEPT_LENGTH) / 4
