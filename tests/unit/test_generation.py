"""The generation engine with a fake server: the shared window, retries, dead letters, suspension."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from inference.client import ChatResult
from inference.errors import InferenceRejected, InferenceUnavailable
from inference.records import Completion, DeadLetter, Message, Origin, SamplingSettings, Usage
from producer.local_stack import wait_until
from tests.support.records import prompt
from workers.generation import REASON_EXHAUSTED, REASON_REJECTED, BatchOutcome, GenerationEngine, RetryPolicy

WINDOW = 4
WAIT_S = 10.0


class FakeServer:
    """Answers each prompt when the test releases it; records concurrency."""

    def __init__(self) -> None:
        self.release: dict[str, threading.Event] = {}
        self.started: list[str] = []
        self.running = 0
        self.peak_running = 0
        self.failures: dict[str, list[Exception]] = {}
        self.lock = threading.Lock()

    def releaser(self, prompt_id: str) -> threading.Event:
        with self.lock:
            return self.release.setdefault(prompt_id, threading.Event())

    async def chat(self, messages: list[Message], sampling: SamplingSettings, rid: str) -> ChatResult:
        prompt_id = rid.split(":")[1]
        with self.lock:
            self.started.append(prompt_id)
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
        try:
            pending = self.failures.get(prompt_id)
            if pending:
                raise pending.pop(0)
            event = self.releaser(prompt_id)
            while not event.is_set():
                await asyncio.sleep(0.001)
        finally:
            with self.lock:
                self.running -= 1
        return ChatResult(
            content="\n\nanswer",
            reasoning_content="\nthought\n",
            finish_reason="stop",
            usage=Usage(prompt_tokens=3, completion_tokens=5, reasoning_tokens=3),
            spec_accept_length=3.5,
            started_at=0.0,
            finished_at=1.0,
        )

    async def close(self) -> None:
        return None


class Recorder:
    def __init__(self) -> None:
        self.staged: list[Completion] = []
        self.dead: list[DeadLetter] = []

    def stage(self, completion: Completion) -> bool:
        self.staged.append(completion)
        return True

    def dead_letter(self, letter: DeadLetter) -> bool:
        self.dead.append(letter)
        return True


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def engine(server: FakeServer) -> Iterator[GenerationEngine]:
    engine = GenerationEngine(
        lambda: server,
        max_in_flight=WINDOW,
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.001, backoff_cap_s=0.001),
        origin=Origin(host="h", gpu=0, server_url="http://sim"),
    )
    yield engine
    engine.close()


def run_in_thread(
    engine: GenerationEngine, ids: list[str], recorder: Recorder
) -> tuple[threading.Thread, list[BatchOutcome]]:
    result: list[BatchOutcome] = []
    prompts = [prompt(i) for i in ids]
    thread = threading.Thread(
        target=lambda: result.append(engine.run_batch("r", prompts, SamplingSettings(), recorder))
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
    outcome = engine.run_batch("r", [prompt("bad", row=7), prompt("good")], SamplingSettings(), recorder)
    assert (outcome.staged, outcome.dead_lettered) == (1, 1)
    (letter,) = recorder.dead
    assert (letter.prompt_id, letter.row, letter.reason, letter.attempts) == ("bad", 7, REASON_REJECTED, 1)
    assert server.started.count("bad") == 1


def test_a_prompt_that_errors_every_attempt_is_dead_lettered_with_the_error(
    engine: GenerationEngine, server: FakeServer
) -> None:
    server.failures["flaky"] = [InferenceUnavailable("HTTP 500: boom", status=500) for _ in range(3)]
    recorder = Recorder()
    outcome = engine.run_batch("r", [prompt("flaky")], SamplingSettings(), recorder)
    assert outcome.dead_lettered == 1
    assert (recorder.dead[0].reason, recorder.dead[0].attempts) == (REASON_EXHAUSTED, 3)
    assert "boom" in recorder.dead[0].error


def test_a_prompt_that_recovers_on_retry_is_staged_with_its_attempt_number(
    engine: GenerationEngine, server: FakeServer
) -> None:
    server.failures["flaky"] = [InferenceUnavailable("HTTP 503: busy", status=503)]
    server.releaser("flaky").set()
    recorder = Recorder()
    engine.run_batch("r", [prompt("flaky")], SamplingSettings(), recorder)
    assert [c.attempt for c in recorder.staged] == [2]


def test_an_unreachable_server_leaves_prompts_pending_instead_of_dead_lettering_them(
    engine: GenerationEngine, server: FakeServer
) -> None:
    server.failures["p"] = [InferenceUnavailable("refused") for _ in range(3)]
    recorder = Recorder()
    outcome = engine.run_batch("r", [prompt("p")], SamplingSettings(), recorder)
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
    outcome = engine.run_batch("r", [prompt("h1")], SamplingSettings(), recorder)
    assert outcome.staged == 1
