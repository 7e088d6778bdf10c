"""The generation engine with a fake server: the shared window, retries, dead letters, suspension,
and budget retries of thinking cut off by max_tokens."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator

import pytest

from core.records import Completion, Message, Origin, Quality, SamplingSettings, Usage
from core.run_settings.model import DEFAULT_RETRY_MAX_TOKENS_CAP, TruncationPolicy
from devstack.local_stack import wait_until
from inference.chat_stream import ChatResult, ProgressCallback
from inference.errors import FailureCause, InferenceRejected, InferenceUnavailable
from tests.support.handover import Recorder
from tests.support.records import prompt
from workers.errors import RecordTooLarge
from workers.generate.generation import (
    CONTEXT_HEADROOM_TOKENS,
    REASON_EXHAUSTED,
    REASON_REJECTED,
    BatchOutcome,
    GenerationEngine,
    RetryPolicy,
    Truncation,
)

WINDOW = 4
WAIT_S = 10.0
PROMPT_TOKENS = 3
CONTEXT_TOKENS = 40_960  # the README's `serve --context-length`
RUN_BUDGET = 32_768  # the README's --max-tokens
ENDLESS_THINKING_TOKENS = 1_000_000  # thinks past any budget: every answer is cut off in thinking


class FakeServer:
    """Answers each prompt when the test releases it; records concurrency."""

    def __init__(self) -> None:
        self.release: dict[str, threading.Event] = {}
        self.started: list[str] = []
        self.running = 0
        self.peak_running = 0
        self.failures: dict[str, list[Exception]] = {}
        self.thinking_tokens: dict[str, int] = {}  # a prompt thinks this long; smaller budgets cut it off
        self.enforced_context: int | None = None  # refuses, as SGLang does, what does not fit
        self.budgets: dict[str, list[int]] = defaultdict(list)  # max_tokens of every request, per prompt
        self.lock = threading.Lock()

    def releaser(self, prompt_id: str) -> threading.Event:
        with self.lock:
            return self.release.setdefault(prompt_id, threading.Event())

    async def chat(
        self,
        messages: list[Message],
        sampling: SamplingSettings,
        rid: str,
        on_progress: ProgressCallback | None = None,
    ) -> ChatResult:
        prompt_id = rid.split(":")[1]
        with self.lock:
            self.started.append(prompt_id)
            self.budgets[prompt_id].append(sampling.max_tokens)
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
        try:
            pending = self.failures.get(prompt_id)
            if pending:
                raise pending.pop(0)
            self._check_context(sampling.max_tokens)
            event = self.releaser(prompt_id)
            while not event.is_set():
                await asyncio.sleep(0.001)
        finally:
            with self.lock:
                self.running -= 1
        thinking = self.thinking_tokens.get(prompt_id, 0)
        if sampling.max_tokens < thinking:
            return ChatResult(
                content="",
                reasoning_content="\nthought",
                finish_reason="length",
                usage=Usage(
                    prompt_tokens=PROMPT_TOKENS,
                    completion_tokens=sampling.max_tokens,
                    reasoning_tokens=sampling.max_tokens,
                ),
                spec_accept_length=3.5,
                started_at=0.0,
                finished_at=1.0,
            )
        return ChatResult(
            content="\n\nanswer",
            reasoning_content="\nthought\n",
            finish_reason="stop",
            usage=Usage(prompt_tokens=3, completion_tokens=5, reasoning_tokens=3),
            spec_accept_length=3.5,
            started_at=0.0,
            finished_at=1.0,
        )

    def _check_context(self, max_tokens: int) -> None:
        if self.enforced_context is not None and PROMPT_TOKENS + max_tokens > self.enforced_context:
            raise InferenceRejected(
                "HTTP 400: Requested token count exceeds the model's maximum context length of "
                f"{self.enforced_context} tokens.",
                status=400,
            )

    async def close(self) -> None:
        return None


class StatingServer(FakeServer):
    """A fake server whose client can say its context length (None: the server does not state it)."""

    def __init__(self, stated_context: int | None) -> None:
        super().__init__()
        self.stated_context = stated_context
        self.context_lookups = 0

    async def context_length(self) -> int | None:
        self.context_lookups += 1
        return self.stated_context


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


def make_engine(server: FakeServer) -> GenerationEngine:
    return GenerationEngine(
        lambda: server,
        max_in_flight=WINDOW,
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.001, backoff_cap_s=0.001),
        origin=Origin(host="h", gpu=0, server_url="http://sim"),
    )


@pytest.fixture
def engine(server: FakeServer) -> Iterator[GenerationEngine]:
    engine = make_engine(server)
    yield engine
    engine.close()


@pytest.fixture
def engine_for() -> Iterator[Callable[[FakeServer], GenerationEngine]]:
    """Engines over a given fake server; all are closed after the test."""
    engines: list[GenerationEngine] = []

    def start(server: FakeServer) -> GenerationEngine:
        engines.append(make_engine(server))
        return engines[-1]

    yield start
    for started in engines:
        started.close()


RETRY_TRUNCATED = Truncation(TruncationPolicy.RETRY, DEFAULT_RETRY_MAX_TOKENS_CAP)


def thinks_forever(server: FakeServer, *prompt_ids: str) -> None:
    for prompt_id in prompt_ids:
        server.thinking_tokens[prompt_id] = ENDLESS_THINKING_TOKENS
        server.releaser(prompt_id).set()


def run_in_thread(
    engine: GenerationEngine, ids: list[str], recorder: Recorder
) -> tuple[threading.Thread, list[BatchOutcome]]:
    result: list[BatchOutcome] = []
    prompts = [prompt(i) for i in ids]
    thread = threading.Thread(
        target=lambda: result.append(
            engine.submit_batch("r", prompts, SamplingSettings(), recorder).outcome()
        )
    )
    thread.start()
    return thread, result


def wait_for(condition: Callable[[], bool], what: str) -> None:
    wait_until(condition, timeout_s=WAIT_S, what=what)


def test_the_next_batch_fills_slots_while_the_first_batch_s_slowest_prompt_runs(
    engine: GenerationEngine, server: FakeServer
) -> None:
    # Given two batches held at once, and a window of 4
    recorder = Recorder()
    first, _ = run_in_thread(engine, ["a1", "a2", "a3", "a4"], recorder)
    wait_for(lambda: len(server.started) == 4, "the first batch to fill the window")
    second, _ = run_in_thread(engine, ["b1", "b2", "b3", "b4"], recorder)
    # When all of the first batch but its slowest prompt finish
    for prompt_id in ("a1", "a2", "a3"):
        server.releaser(prompt_id).set()
    # Then the second batch's prompts take the freed slots while a4 still runs
    wait_for(lambda: {"b1", "b2", "b3"} <= set(server.started), "the second batch to take the free slots")
    assert server.running == WINDOW
    for prompt_id in ("a4", "b1", "b2", "b3", "b4"):
        server.releaser(prompt_id).set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert server.peak_running == WINDOW
    assert len(recorder.staged) == 8


def test_a_rejected_prompt_is_dead_lettered_at_once_and_its_batch_completes(
    engine: GenerationEngine, server: FakeServer
) -> None:
    server.failures["bad"] = [InferenceRejected("HTTP 400: too long", status=400)]
    server.releaser("good").set()
    recorder = Recorder()
    outcome = engine.submit_batch(
        "r", [prompt("bad", row=7, file="shard-2.jsonl"), prompt("good")], SamplingSettings(), recorder
    ).outcome()
    assert (outcome.staged, outcome.dead_lettered) == (1, 1)
    (letter,) = recorder.dead
    assert (letter.prompt_id, letter.reason, letter.attempts) == ("bad", REASON_REJECTED, 1)
    assert (letter.file, letter.row) == ("shard-2.jsonl", 7)  # where to find it in the input
    assert server.started.count("bad") == 1


def test_a_prompt_that_errors_every_attempt_is_dead_lettered_with_the_error(
    engine: GenerationEngine, server: FakeServer
) -> None:
    server.failures["flaky"] = [InferenceUnavailable("HTTP 500: boom", status=500) for _ in range(3)]
    recorder = Recorder()
    outcome = engine.submit_batch("r", [prompt("flaky")], SamplingSettings(), recorder).outcome()
    assert outcome.dead_lettered == 1
    assert (recorder.dead[0].reason, recorder.dead[0].attempts) == (REASON_EXHAUSTED, 3)
    assert "boom" in recorder.dead[0].error


def test_a_prompt_that_recovers_on_retry_is_staged_with_its_attempt_number(
    engine: GenerationEngine, server: FakeServer
) -> None:
    server.failures["flaky"] = [InferenceUnavailable("HTTP 503: busy", status=503)]
    server.releaser("flaky").set()
    recorder = Recorder()
    engine.submit_batch("r", [prompt("flaky")], SamplingSettings(), recorder).outcome()
    assert [c.attempt for c in recorder.staged] == [2]


def test_an_unreachable_server_leaves_prompts_pending_instead_of_dead_lettering_them(
    engine: GenerationEngine, server: FakeServer
) -> None:
    server.failures["p"] = [InferenceUnavailable("refused", cause=FailureCause.REFUSED) for _ in range(3)]
    recorder = Recorder()
    outcome = engine.submit_batch("r", [prompt("p")], SamplingSettings(), recorder).outcome()
    assert outcome.unreachable == ["p"]
    assert recorder.dead == [] and recorder.staged == []


def test_suspending_abandons_requests_in_flight_and_returns_their_prompts(
    engine: GenerationEngine, server: FakeServer
) -> None:
    # Given a batch whose requests hang at the server
    recorder = Recorder()
    thread, result = run_in_thread(engine, ["h1", "h2", "h3", "h4", "h5", "h6"], recorder)
    wait_for(lambda: len(server.started) == WINDOW, "requests to be in flight")
    # When the worker suspends (the server is hung)
    engine.suspend("server hung")
    thread.join(WAIT_S)
    # Then the batch returns at once with every prompt pending, nothing staged or dead-lettered
    assert not thread.is_alive()
    assert sorted(result[0].unreachable) == ["h1", "h2", "h3", "h4", "h5", "h6"]
    assert recorder.staged == [] and recorder.dead == []
    assert engine.in_flight == 0
    # And after resuming, work flows again
    engine.resume()
    server.releaser("h1").set()
    outcome = engine.submit_batch("r", [prompt("h1")], SamplingSettings(), recorder).outcome()
    assert outcome.staged == 1


def test_a_budget_retry_never_asks_for_more_than_the_server_s_context_leaves(
    engine_for: Callable[[FakeServer], GenerationEngine],
) -> None:
    # Given the README's server (40,960 tokens of context) and a run retrying truncated thinking
    server = StatingServer(stated_context=CONTEXT_TOKENS)
    server.enforced_context = CONTEXT_TOKENS
    thinks_forever(server, "long")
    recorder = Recorder()
    # When a prompt thinks past every budget
    outcome = (
        engine_for(server)
        .submit_batch(
            "r", [prompt("long")], SamplingSettings(max_tokens=RUN_BUDGET), recorder, RETRY_TRUNCATED
        )
        .outcome()
    )
    # Then the retry asks for what the context leaves after the prompt, not double, and stops there
    fits = CONTEXT_TOKENS - PROMPT_TOKENS - CONTEXT_HEADROOM_TOKENS
    assert server.budgets["long"] == [RUN_BUDGET, fits]
    assert (outcome.staged, outcome.dead_lettered) == (1, 0)
    (kept,) = recorder.staged
    assert (kept.quality, kept.sampling.max_tokens, kept.budget_retries) == (
        Quality.TRUNCATED_IN_THINKING,
        fits,
        1,
    )


def test_a_refused_budget_retry_keeps_the_completion_it_had(
    engine_for: Callable[[FakeServer], GenerationEngine],
) -> None:
    # Given a server that does not state its context but refuses what exceeds it
    server = StatingServer(stated_context=None)
    server.enforced_context = CONTEXT_TOKENS
    thinks_forever(server, "long")
    recorder = Recorder()
    # When the first budget retry is answered (still cut off) and the second one is refused
    first_budget = RUN_BUDGET // 2
    outcome = (
        engine_for(server)
        .submit_batch(
            "r", [prompt("long")], SamplingSettings(max_tokens=first_budget), recorder, RETRY_TRUNCATED
        )
        .outcome()
    )
    assert server.budgets["long"] == [first_budget, RUN_BUDGET, 2 * RUN_BUDGET]
    # Then the completion of the last budget answered is staged, saying which budget and retry made it
    assert (outcome.staged, outcome.dead_lettered) == (1, 0)
    assert recorder.dead == []
    (kept,) = recorder.staged
    assert (kept.quality, kept.sampling.max_tokens, kept.budget_retries) == (
        Quality.TRUNCATED_IN_THINKING,
        RUN_BUDGET,
        1,
    )


class FailsAboveBudget(StatingServer):
    """Answers within a budget; anything larger fails with a 5xx, every time."""

    def __init__(self, budget: int) -> None:
        super().__init__(stated_context=None)
        self.budget = budget

    def _check_context(self, max_tokens: int) -> None:
        if max_tokens > self.budget:
            raise InferenceUnavailable("HTTP 503: overloaded")


def test_a_budget_retry_that_fails_every_attempt_keeps_the_completion_it_had(
    engine_for: Callable[[FakeServer], GenerationEngine],
) -> None:
    # Given a prompt cut off in thinking, whose budget retry fails with 5xx on every attempt
    server = FailsAboveBudget(budget=RUN_BUDGET)
    thinks_forever(server, "long")
    recorder = Recorder()
    outcome = (
        engine_for(server)
        .submit_batch(
            "r", [prompt("long")], SamplingSettings(max_tokens=RUN_BUDGET), recorder, RETRY_TRUNCATED
        )
        .outcome()
    )
    # Then the truncated completion is staged, not dead-lettered, and the batch is not handed back
    assert (outcome.staged, outcome.dead_lettered, outcome.unreachable) == (1, 0, [])
    assert recorder.staged[0].sampling.max_tokens == RUN_BUDGET


def test_a_refusal_on_the_first_attempt_still_dead_letters_under_the_retry_policy(
    engine_for: Callable[[FakeServer], GenerationEngine],
) -> None:
    server = StatingServer(stated_context=CONTEXT_TOKENS)
    server.failures["bad"] = [InferenceRejected("HTTP 400: too long", status=400)]
    recorder = Recorder()
    outcome = (
        engine_for(server)
        .submit_batch("r", [prompt("bad")], SamplingSettings(), recorder, RETRY_TRUNCATED)
        .outcome()
    )
    assert (outcome.staged, outcome.dead_lettered) == (0, 1)
    assert recorder.dead[0].reason == REASON_REJECTED


def test_a_server_that_does_not_state_its_context_is_capped_only_by_the_configured_cap(
    engine_for: Callable[[FakeServer], GenerationEngine],
) -> None:
    # Given one server whose client cannot ask, and one that asks and is told nothing
    for server in (FakeServer(), StatingServer(stated_context=None)):
        thinks_forever(server, "long")
        recorder = Recorder()
        # When a prompt thinks past every budget
        engine_for(server).submit_batch(
            "r", [prompt("long")], SamplingSettings(max_tokens=RUN_BUDGET), recorder, RETRY_TRUNCATED
        ).outcome()
        # Then the budget doubles up to the cap, and the cap's completion is kept
        assert server.budgets["long"] == [RUN_BUDGET, 2 * RUN_BUDGET, DEFAULT_RETRY_MAX_TOKENS_CAP]
        (kept,) = recorder.staged
        assert (kept.sampling.max_tokens, kept.budget_retries) == (DEFAULT_RETRY_MAX_TOKENS_CAP, 2)


def test_the_server_s_context_is_asked_once_and_only_when_a_retry_is_on_the_table(
    engine_for: Callable[[FakeServer], GenerationEngine],
) -> None:
    server = StatingServer(stated_context=CONTEXT_TOKENS)
    engine = engine_for(server)
    # A batch that is never cut off does not ask
    server.releaser("short").set()
    engine.submit_batch("r", [prompt("short")], SamplingSettings(), Recorder(), RETRY_TRUNCATED).outcome()
    assert server.context_lookups == 0
    # Batches cut off ask once, and every later retry uses the answer
    thinks_forever(server, "a", "b", "c")
    engine.submit_batch(
        "r", [prompt("a"), prompt("b")], SamplingSettings(), Recorder(), RETRY_TRUNCATED
    ).outcome()
    engine.submit_batch("r", [prompt("c")], SamplingSettings(), Recorder(), RETRY_TRUNCATED).outcome()
    assert server.context_lookups == 1


def test_a_retry_that_would_not_grow_the_budget_is_not_made() -> None:
    fits = CONTEXT_TOKENS - PROMPT_TOKENS - CONTEXT_HEADROOM_TOKENS
    assert (
        RETRY_TRUNCATED.next_budget(fits, prompt_tokens=PROMPT_TOKENS, context_length=CONTEXT_TOKENS) is None
    )
    assert RETRY_TRUNCATED.next_budget(DEFAULT_RETRY_MAX_TOKENS_CAP) is None
    assert Truncation(TruncationPolicy.KEEP).next_budget(RUN_BUDGET, context_length=CONTEXT_TOKENS) is None


def test_a_batch_says_it_is_sent_once_its_last_prompt_is_at_the_server_long_before_it_is_done(
    engine: GenerationEngine, server: FakeServer
) -> None:
    # Given a batch of six prompts and a window of four
    job = engine.submit_batch("r", [prompt(f"p{i}") for i in range(6)], SamplingSettings(), Recorder())
    wait_for(lambda: len(server.started) == WINDOW, "the window to fill")
    assert not job.sent.is_set()  # two prompts still wait for a slot
    # When two requests finish, the last two prompts take their slots
    for prompt_id in ("p0", "p1"):
        server.releaser(prompt_id).set()
    # Then the batch is sent while four of its requests still run, and done only when they end
    assert job.sent.wait(WAIT_S)
    assert not job.done.done()
    for prompt_id in ("p2", "p3", "p4", "p5"):
        server.releaser(prompt_id).set()
    assert job.outcome().staged == 6


class RefusingLargeRecords(Recorder):
    """A hand-over that refuses one prompt's completion as past the record limit, as RunLedger.stage does."""

    def __init__(self, too_large: str) -> None:
        super().__init__()
        self._too_large = too_large

    def stage(self, completion: Completion) -> bool:
        if completion.prompt_id == self._too_large:
            raise RecordTooLarge("its record is 70,000,000 bytes, past the record limit")
        return super().stage(completion)


def test_a_completion_past_the_record_limit_is_dead_lettered_not_handed_over(
    engine: GenerationEngine, server: FakeServer
) -> None:
    for prompt_id in ("huge", "fine"):
        server.releaser(prompt_id).set()
    recorder = RefusingLargeRecords("huge")

    outcome = engine.submit_batch(
        "r", [prompt("huge"), prompt("fine")], SamplingSettings(), recorder
    ).outcome()

    assert (outcome.staged, outcome.dead_lettered) == (1, 1)
    assert [(letter.prompt_id, letter.reason) for letter in recorder.dead] == [("huge", "record_too_large")]
    assert "past the record limit" in recorder.dead[0].error
