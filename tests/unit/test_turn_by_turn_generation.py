"""Conversations regenerated turn by turn by the generation engine, with a fake server: what each
request holds, resuming at the next turn, per-turn truncation and failures, the window kept full
while conversations hold their seats, each next turn asked while the turns before are still being saved,
and resumed conversations seated before new work."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence

import pytest

from core.records import (
    Completion,
    Message,
    Origin,
    Prompt,
    Quality,
    SamplingSettings,
    Turn,
    Turns,
    Usage,
)
from core.run_settings.model import TruncationPolicy
from devstack.local_stack import wait_until
from inference.chat_stream import ChatResult, ProgressCallback
from inference.errors import InferenceRejected
from intake.rows import parse_row
from tests.support.handover import Recorder
from tests.support.records import completion
from workers.generate.generation import BatchJob, GenerationEngine, RetryPolicy, Truncation

WAIT_S = 10.0
MARKER = "ORIGINAL-ASSISTANT"


class TurnServer:
    """Answers each request with what it answered (`answer to <last user turn>`), at once or when the
    test releases that turn; records every request's messages."""

    def __init__(self, *, held: bool = False) -> None:
        self.requests: list[list[Message]] = []
        self.held = held
        self.release: dict[str, threading.Event] = {}
        self.running = 0
        self.peak_running = 0
        self.lock = threading.Lock()

    def releaser(self, user_text: str) -> threading.Event:
        with self.lock:
            return self.release.setdefault(user_text, threading.Event())

    async def chat(
        self,
        messages: list[Message],
        sampling: SamplingSettings,
        rid: str,
        on_progress: ProgressCallback | None = None,
    ) -> ChatResult:
        question = messages[-1].content
        with self.lock:
            self.requests.append(list(messages))
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
        try:
            if "refused" in question:
                raise InferenceRejected("HTTP 400: too long", status=400)
            if self.held:
                event = self.releaser(question)
                while not event.is_set():
                    await asyncio.sleep(0.001)
        finally:
            with self.lock:
                self.running -= 1
        if "endless" in question:
            usage = Usage(prompt_tokens=3, completion_tokens=sampling.max_tokens, reasoning_tokens=3)
            return ChatResult(
                content="",
                reasoning_content="\nthinking",
                finish_reason="length",
                usage=usage,
                spec_accept_length=None,
                started_at=0.0,
                finished_at=1.0,
            )
        usage = Usage(prompt_tokens=3, completion_tokens=5, reasoning_tokens=2)
        return ChatResult(
            content=f"answer to {question}",
            reasoning_content=f"thinking about {question}",
            finish_reason="stop",
            usage=usage,
            spec_accept_length=None,
            started_at=0.0,
            finished_at=1.0,
            prompt_token_ids=[1, 2, 3],
            response_token_ids=[4, 5, 6, 7, 8],
        )

    async def close(self) -> None:
        return None


def conversation(prompt_id: str, *questions: str, row: int = 1) -> Prompt:
    """A row of these user turns, each answered in the dataset by a marked assistant turn."""
    messages = [{"role": "system", "content": "be brief"}]
    for question in questions:
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": f"{MARKER} on {question}"},
        ]
    parsed = parse_row({"id": prompt_id, "messages": messages}, row=row, turns=Turns.ALL)
    assert isinstance(parsed, Prompt)
    return parsed


def engine_of(server: TurnServer, window: int = 4) -> GenerationEngine:
    return GenerationEngine(
        lambda: server,
        max_in_flight=window,
        retry=RetryPolicy(max_attempts=2, backoff_base_s=0.001, backoff_cap_s=0.001),
        origin=Origin(host="h", gpu=0, server_url="http://sim"),
    )


@pytest.fixture
def server() -> TurnServer:
    return TurnServer()


@pytest.fixture
def engine(server: TurnServer) -> Iterator[GenerationEngine]:
    started = engine_of(server)
    yield started
    started.close()


def generate(
    engine: GenerationEngine, prompts: list[Prompt], recorder: Recorder, truncation: Truncation | None = None
) -> None:
    engine.submit_batch("r", prompts, SamplingSettings(), recorder, truncation).outcome()


def test_each_turn_is_asked_with_the_answers_regenerated_before_it_and_never_the_datasets(
    engine: GenerationEngine, server: TurnServer
) -> None:
    # Given a conversation of three user turns, each answered in the dataset by a marked turn
    recorder = Recorder()
    # When it is generated
    generate(engine, [conversation("c", "q1", "q2", "q3")], recorder)
    # Then three requests went out, request j holding the regenerated answers of the turns before it
    assert [[m.content for m in request] for request in server.requests] == [
        ["be brief", "q1"],
        ["be brief", "q1", "answer to q1", "q2"],
        ["be brief", "q1", "answer to q1", "q2", "answer to q2", "q3"],
    ]
    assert not any(MARKER in m.content for request in server.requests for m in request)
    # And no earlier thinking is sent back
    assert not any("thinking" in m.content for request in server.requests for m in request)
    # And one completion holds the conversation: the last request and answer, and the two turns before
    [staged] = recorder.staged
    assert staged.content == "answer to q3"
    assert [turn.content for turn in staged.earlier_turns] == ["answer to q1", "answer to q2"]
    assert [turn.reasoning_content for turn in staged.turns()] == [
        "thinking about q1",
        "thinking about q2",
        "thinking about q3",
    ]
    assert staged.conversation_turns == staged.generated_turns == 3
    assert all(turn.response_token_ids == [4, 5, 6, 7, 8] for turn in staged.turns())
    assert recorder.turns == {}  # nothing kept once it is staged


def test_a_later_delivery_resumes_at_the_turn_after_the_ones_kept(server: TurnServer) -> None:
    # Given a worker whose server went away at the third turn of a conversation, two turns finished
    first_server, recorder = TurnServer(held=True), Recorder()
    first = engine_of(first_server)
    try:
        first_server.releaser("q1").set()
        first_server.releaser("q2").set()
        job = first.submit_batch("r", [conversation("c", "q1", "q2", "q3")], SamplingSettings(), recorder)
        wait_until(lambda: len(first_server.requests) == 3, timeout_s=WAIT_S, what="the third turn")
        first.suspend("server hung")
        assert job.outcome().unreachable == ["c"]
    finally:
        first.close()
    assert recorder.staged == [] and recorder.dead == []
    # When another worker takes the conversation over
    second = engine_of(server)
    try:
        generate(second, [conversation("c", "q1", "q2", "q3")], recorder)
    finally:
        second.close()
    # Then it asks the third turn only, with the kept answers in place
    assert [[m.content for m in request] for request in server.requests] == [
        ["be brief", "q1", "answer to q1", "q2", "answer to q2", "q3"]
    ]
    [staged] = recorder.staged
    assert [turn.content for turn in staged.turns()] == ["answer to q1", "answer to q2", "answer to q3"]


def test_a_turn_refused_by_the_server_dead_letters_the_whole_conversation_naming_the_turn(
    engine: GenerationEngine,
) -> None:
    recorder = Recorder()
    generate(engine, [conversation("c", "q1", "refused q2", "q3")], recorder)
    assert recorder.staged == []
    [letter] = recorder.dead
    assert letter.turn == 2
    assert letter.error.startswith("turn 2 of 3: ")


def test_a_turn_truncated_in_thinking_ends_the_conversation_there_labelled_so(
    engine: GenerationEngine, server: TurnServer
) -> None:
    recorder = Recorder()
    generate(engine, [conversation("c", "q1", "endless q2", "q3")], recorder)
    # Then the third turn is never asked: it would answer a broken one
    assert len(server.requests) == 2
    [staged] = recorder.staged
    assert staged.quality is Quality.TRUNCATED_IN_THINKING
    assert (staged.generated_turns, staged.conversation_turns) == (2, 3)


def test_a_run_that_drops_truncated_thinking_dead_letters_the_conversation_at_that_turn(
    engine: GenerationEngine,
) -> None:
    recorder = Recorder()
    drop = Truncation(TruncationPolicy.DROP)
    generate(engine, [conversation("c", "q1", "endless q2", "q3")], recorder, drop)
    [letter] = recorder.dead
    assert (letter.turn, letter.reason) == (2, "truncated_in_thinking")


def test_the_budget_retry_works_per_turn(engine: GenerationEngine, server: TurnServer) -> None:
    recorder = Recorder()
    retry = Truncation(TruncationPolicy.RETRY, max_tokens_cap=4 * SamplingSettings().max_tokens)
    generate(engine, [conversation("c", "q1", "endless q2")], recorder, retry)
    [staged] = recorder.staged
    # the second turn was asked at 1x, 2x and 4x the budget, then kept as the cap gave it
    assert len(server.requests) == 4
    assert staged.budget_retries == 2
    assert staged.earlier_turns[0].budget_retries == 0


def test_conversations_begun_hold_their_seats_and_the_window_stays_full() -> None:
    # Given a window of 2 and three conversations of two turns, their turns answered when released
    server = TurnServer(held=True)
    engine = engine_of(server, window=2)
    recorder = Recorder()
    prompts = [conversation(name, f"{name}1", f"{name}2", row=i) for i, name in enumerate("abc")]
    thread = threading.Thread(target=generate, args=(engine, prompts, recorder))
    thread.start()
    try:
        wait_until(lambda: server.running == 2, timeout_s=WAIT_S, what="the window to fill")
        # When the first turns of a and b end
        server.releaser("a1").set()
        server.releaser("b1").set()
        # Then their second turns take the slots, not c's first: the conversations begun go first
        wait_until(
            lambda: {r[-1].content for r in server.requests} == {"a1", "b1", "a2", "b2"},
            timeout_s=WAIT_S,
            what="the second turns of a and b",
        )
        assert server.running == 2
        # And when a ends, c starts in its slot at once
        server.releaser("a2").set()
        wait_until(lambda: server.requests[-1][-1].content == "c1", timeout_s=WAIT_S, what="c to start")
        for question in ("b2", "c1", "c2"):
            server.releaser(question).set()
        thread.join(WAIT_S)
    finally:
        for event in list(server.release.values()):
            event.set()
        thread.join(WAIT_S)
        engine.close()
    assert server.peak_running == 2
    assert sorted(c.prompt_id for c in recorder.staged) == ["a", "b", "c"]


def test_single_turn_rows_are_unchanged_by_turn_by_turn_generation(
    engine: GenerationEngine, server: TurnServer
) -> None:
    recorder = Recorder()
    single = parse_row({"id": "s", "messages": [{"role": "user", "content": "q"}]}, row=1, turns=Turns.ALL)
    assert isinstance(single, Prompt) and single.turn_ends == []
    generate(engine, [single], recorder)
    [staged] = recorder.staged
    assert (staged.earlier_turns, staged.conversation_turns) == ([], 1)
    assert [[m.content for m in r] for r in server.requests] == [["q"]]


def single(prompt_id: str, question: str, *, row: int) -> Prompt:
    parsed = parse_row(
        {"id": prompt_id, "messages": [{"role": "user", "content": question}]}, row=row, turns=Turns.ALL
    )
    assert isinstance(parsed, Prompt)
    return parsed


def resumed_at_its_second_turn(recorder: Recorder) -> Prompt:
    """Conversation `resumed` (questions r1, r2), whose first turn the run keeps."""
    recorder.turns["resumed"] = [completion("resumed", content="answer to r1").as_turn()]
    return conversation("resumed", "r1", "r2", row=3)


class SlowSaves(Recorder):
    """The run's state, whose first save of kept turns lands only when the test lets it; logs each write
    as it lands: ("keep", turns kept) or ("stage", prompt id)."""

    def __init__(self) -> None:
        super().__init__()
        self.saves_land = threading.Event()
        self.saving = threading.Event()  # the first save has begun and waits to land
        self.landed: list[tuple[str, object]] = []

    def keep_turns(self, prompt_id: str, turns: list[Turn]) -> bool:
        if not self.saving.is_set():
            self.saving.set()
            assert self.saves_land.wait(WAIT_S)
        self.landed.append(("keep", len(turns)))
        return super().keep_turns(prompt_id, turns)

    def stage(self, completion: Completion) -> bool:
        self.landed.append(("stage", completion.prompt_id))
        return super().stage(completion)


def test_the_next_turn_is_asked_while_the_turns_before_it_are_still_being_saved(
    engine: GenerationEngine, server: TurnServer
) -> None:
    # Given a run whose first save of kept turns is slow
    recorder = SlowSaves()
    job = engine.submit_batch("r", [conversation("c", "q1", "q2", "q3")], SamplingSettings(), recorder)
    try:
        # When the first turn ends, its save begun and not landed
        assert recorder.saving.wait(WAIT_S)
        # Then the second turn is asked already, and the third too: nothing waits for the saves
        wait_until(lambda: len(server.requests) == 3, timeout_s=WAIT_S, what="the next turns to be asked")
        assert recorder.landed == [] and recorder.staged == []
    finally:
        recorder.saves_land.set()
    assert job.outcome().staged == 1


def test_the_saves_of_a_conversation_land_in_order_and_before_its_stage(
    engine: GenerationEngine, server: TurnServer
) -> None:
    # Given a conversation of three turns whose first save is held until every turn is answered
    recorder = SlowSaves()
    job = engine.submit_batch("r", [conversation("c", "q1", "q2", "q3")], SamplingSettings(), recorder)
    wait_until(lambda: len(server.requests) == 3, timeout_s=WAIT_S, what="every turn to be asked")
    # When the saves may land
    recorder.saves_land.set()
    outcome = job.outcome()
    # Then the first turn's save landed before the second's, and both before the conversation was staged
    assert recorder.landed == [("keep", 1), ("keep", 2), ("stage", "c")]
    assert outcome.staged == 1 and recorder.turns == {}


class FailingSaves(Recorder):
    def keep_turns(self, prompt_id: str, turns: list[Turn]) -> bool:
        raise ConnectionError("Redis went away")


def test_a_save_that_fails_fails_the_batch_and_nothing_is_staged(engine: GenerationEngine) -> None:
    recorder = FailingSaves()
    job = engine.submit_batch("r", [conversation("c", "q1", "q2", "q3")], SamplingSettings(), recorder)
    with pytest.raises(ConnectionError):
        job.outcome()
    assert recorder.staged == []


def test_a_resumed_conversation_takes_a_freed_slot_before_new_work_that_waited_longer() -> None:
    # Given a window of one slot, held by a new conversation of two turns
    server = TurnServer(held=True)
    engine = engine_of(server, window=1)
    recorder = Recorder()
    resumed = resumed_at_its_second_turn(recorder)
    jobs: list[BatchJob] = []
    try:
        jobs.append(engine.submit_batch("r", [conversation("a", "a1", "a2")], SamplingSettings(), recorder))
        wait_until(lambda: server.running == 1, timeout_s=WAIT_S, what="a to take the slot")
        # And a new prompt waiting for the slot, then a conversation resumed at its second turn after it
        jobs.append(engine.submit_batch("r", [single("new", "n1", row=2)], SamplingSettings(), recorder))
        wait_until(lambda: engine.waiting_for_slot == 1, timeout_s=WAIT_S, what="the new prompt to wait")
        jobs.append(engine.submit_batch("r", [resumed], SamplingSettings(), recorder))
        wait_until(lambda: engine.waiting_for_slot == 2, timeout_s=WAIT_S, what="the resumed one to wait")
        # When the conversation holding the slot ends
        for question in ("a1", "a2", "r2", "n1"):
            server.releaser(question).set()
        for job in jobs:
            job.outcome()
    finally:
        for event in list(server.release.values()):
            event.set()
        engine.close()
    # Then the resumed conversation had the slot first, the new prompt after it
    assert [request[-1].content for request in server.requests] == ["a1", "a2", "r2", "n1"]


class SlowKeptTurns(Recorder):
    """The run's state, whose read of kept turns answers only when the test lets it."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = threading.Event()
        self.reading = threading.Event()

    def kept_turns(self, prompt_ids: Sequence[str]) -> dict[str, list[Turn]]:
        self.reading.set()
        assert self.answer.wait(WAIT_S)
        return super().kept_turns(prompt_ids)


def test_a_new_prompt_does_not_take_the_slot_of_a_conversation_resumed_in_a_batch_still_arriving() -> None:
    # Given a worker with one free slot, and a batch resuming a conversation whose kept turns are being read
    server = TurnServer(held=True)
    engine = engine_of(server, window=1)
    recorder = SlowKeptTurns()
    resumed = resumed_at_its_second_turn(recorder)
    jobs: list[BatchJob] = []
    try:
        jobs.append(engine.submit_batch("r", [resumed], SamplingSettings(), recorder))
        assert recorder.reading.wait(WAIT_S)
        # When a batch of a new prompt is delivered meanwhile
        jobs.append(engine.submit_batch("r", [single("new", "n1", row=2)], SamplingSettings(), recorder))
        wait_until(lambda: engine.waiting_for_slot == 1, timeout_s=WAIT_S, what="the new prompt to wait")
        recorder.answer.set()
        for question in ("r2", "n1"):
            server.releaser(question).set()
        for job in jobs:
            job.outcome()
    finally:
        recorder.answer.set()
        for event in list(server.release.values()):
            event.set()
        engine.close()
    # Then the resumed conversation had the slot first
    assert [request[-1].content for request in server.requests] == ["r2", "n1"]
