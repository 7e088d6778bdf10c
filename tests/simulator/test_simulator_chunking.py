"""SGLang's stream chunking (`output_streamer.py`): a chunk after every decode step, carrying the
tokens that step produced (with MTP about the accept length, 3.5), the first token at once; with
--stream-interval N a chunk whenever at least N tokens are unsent. The chunk count is the server's,
whatever the speedup; --stream-chunking wall keeps the simulator's older chunk per write."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import httpx
import pytest

from inference.simulator import SimulatorProcess

OUTPUT_TOKENS = 200
ACCEPT_LENGTH = 3.5  # the default: tokens per request per decode step
STREAM_INTERVAL = 8


def content_chunk_tokens(sim: SimulatorProcess) -> list[int]:
    """Tokens (filler words, one token each) carried by each content chunk of one streamed answer."""
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Count the chunks."}],
        "max_tokens": OUTPUT_TOKENS,
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
    sim = start_simulator()  # speedup 1000: the chunks are a real server's all the same

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
    sim = start_simulator(stream_interval=STREAM_INTERVAL)

    chunks = content_chunk_tokens(sim)

    assert sum(chunks) == OUTPUT_TOKENS
    assert chunks[0] == 1
    # whole steps: the first step after which at least 8 tokens wait, 3 steps of 3 or 4 tokens
    assert set(chunks[1:-1]) == {10, 11}
    assert chunks[-1] <= 11


def test_wall_chunking_sends_all_that_is_new_in_one_chunk(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(stream_chunking="wall")

    chunks = content_chunk_tokens(sim)

    assert sum(chunks) == OUTPUT_TOKENS
    assert len(chunks) < math.ceil(OUTPUT_TOKENS / ACCEPT_LENGTH) / 4  # at speedup 1000, a few writes
