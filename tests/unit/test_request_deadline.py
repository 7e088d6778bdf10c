"""A hung request is told from a long one by the server's own decode rate, not by the 20-minute timeout."""

from __future__ import annotations

import asyncio

from inference.chat_stream import ChatResult
from inference.records import Message, Origin, SamplingSettings, Usage
from tests.support.handover import Recorder
from tests.support.records import prompt
from workers.generation import GenerationEngine, RetryPolicy
from workers.request_deadline import MIN_RATES, DeadlinePolicy, RequestDeadlines

TOKENS = 1_000
LATENCY_S = 1.0  # every answer: 1,000 tokens in one second
QUICK = DeadlinePolicy(factor=1.0, slack_s=0.05)
BUDGET = 100  # at 1,000 tokens/s: a deadline of 0.1 s + 0.05 s of slack


def test_no_deadline_is_set_before_the_server_has_shown_its_decode_rate() -> None:
    deadlines = RequestDeadlines(DeadlinePolicy())
    for _ in range(MIN_RATES - 1):
        deadlines.observe(TOKENS, LATENCY_S)
    assert deadlines.deadline_s(32_768) is None


def test_the_deadline_is_a_multiple_of_the_budget_at_a_slow_rate_of_late_plus_slack() -> None:
    deadlines = RequestDeadlines(DeadlinePolicy(factor=3.0, slack_s=30.0))
    for latency_s in [1.0] * 90 + [2.0] * 10:  # a tenth of the requests decoded at half the speed
        deadlines.observe(TOKENS, latency_s)
    assert deadlines.slow_rate() == TOKENS / 2.0
    assert deadlines.deadline_s(32_768) == 3.0 * 32_768 / 500.0 + 30.0


def test_short_answers_say_nothing_about_decoding_and_are_not_counted() -> None:
    deadlines = RequestDeadlines(DeadlinePolicy())
    for _ in range(MIN_RATES * 2):
        deadlines.observe(10, 5.0)
    assert deadlines.slow_rate() is None


class HangsOnce:
    """Answers at once; the prompt `hung` hangs on its first attempt, as a wedged request does."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    async def chat(self, messages: list[Message], sampling: SamplingSettings, rid: str) -> ChatResult:
        prompt_id = rid.split(":")[1]
        self.calls[prompt_id] = self.calls.get(prompt_id, 0) + 1
        if prompt_id == "hung" and self.calls[prompt_id] == 1:
            await asyncio.Event().wait()
        return ChatResult(
            content="\n\nanswer",
            reasoning_content="\nthought\n",
            finish_reason="stop",
            usage=Usage(prompt_tokens=3, completion_tokens=TOKENS, reasoning_tokens=TOKENS // 2),
            spec_accept_length=None,
            started_at=0.0,
            finished_at=LATENCY_S,
        )

    async def close(self) -> None:
        return None


def test_a_request_hung_past_its_deadline_is_abandoned_and_tried_again() -> None:
    server = HangsOnce()
    engine = GenerationEngine(
        lambda: server,
        max_in_flight=4,
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.001, backoff_cap_s=0.001),
        origin=Origin(host="h", gpu=0, server_url="http://sim"),
        deadlines=QUICK,
    )
    try:
        recorder = Recorder()
        sampling = SamplingSettings(max_tokens=BUDGET)
        warm_up = [prompt(f"p{i}") for i in range(MIN_RATES)]
        engine.submit_batch("r", warm_up, sampling, recorder).outcome()
        outcome = engine.submit_batch("r", [prompt("hung")], sampling, recorder).outcome()
    finally:
        engine.close()
    assert (outcome.staged, outcome.dead_lettered, outcome.unreachable) == (1, 0, [])
    assert server.calls["hung"] == 2
