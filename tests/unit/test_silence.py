"""A hung request is told from a long one by its own progress: silent for the limit while the server
streams others, it is cut and tried again, whatever its budget; a server silent for everyone is
liveness's to judge; a lone silent request is cut once the server answers a one-token question."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, defaultdict

from core.records import Message, Origin, SamplingSettings, Usage
from inference.chat_stream import ChatResult, ProgressCallback
from tests.support.handover import Recorder
from tests.support.records import prompt
from workers.generate.generation import GenerationEngine, RetryPolicy
from workers.generate.silence import (
    PROBE_RID_PREFIX,
    RECHECK_FRACTION,
    SEND_ORDER_MARGIN_S,
    SERVER_ACTIVE_FRACTION,
    SilenceJudge,
    Verdict,
)

LIMIT_S = 30.0  # the default, for the judge: its clock is the test's
SHORT_LIMIT_S = 0.5  # for the engine on a real clock: a hang is told in half a second, so the tests are quick
LATENESS_S = 1.0  # how late past the limit a cut may come on a busy test machine
CHUNK_INTERVAL_S = 0.02  # a streaming request's chunks, as a decode step or two give them
BUDGET = 32_768  # the budget plays no part: a 32k request is cut as soon as a short one
ALWAYS = 1_000  # attempts that fall silent: every one
WAIT_S = 30.0  # a batch that takes longer has not been cut


def judge_with(*keys_sent_at: tuple[str, float]) -> SilenceJudge:
    judge = SilenceJudge(LIMIT_S)
    for key, sent_at in keys_sent_at:
        judge.sent(key, sent_at)
    return judge


def test_a_request_silent_for_the_limit_while_others_stream_is_cut() -> None:
    judge = judge_with(("silent", 0.0), ("streaming", 0.0))
    judge.chunk("silent", 1.0)
    for second in range(2, 40):
        judge.chunk("streaming", float(second))

    assert judge.judge("silent", 1.0 + LIMIT_S - 0.1).verdict is Verdict.WAIT
    judgement = judge.judge("silent", 1.0 + LIMIT_S)
    assert judgement.verdict is Verdict.CUT and "silent for 30 s" in judgement.reason


def test_a_request_is_looked_at_again_when_its_silence_would_reach_the_limit() -> None:
    judge = judge_with(("a", 0.0), ("b", 0.0))
    judge.chunk("a", 12.0)
    assert judge.judge("a", 20.0).look_again_at == 12.0 + LIMIT_S


def test_when_every_request_is_silent_none_is_cut_the_server_is_hung() -> None:
    judge = judge_with(("a", 0.0), ("b", 0.0), ("c", 0.0))
    for key, last in (("a", 10.0), ("b", 10.1), ("c", 10.2)):
        judge.chunk(key, last)

    for now in (10.0 + LIMIT_S, 10.0 + 5 * LIMIT_S):
        assert {judge.judge(key, now).verdict for key in "abc"} == {Verdict.WAIT}


def test_a_server_that_hung_soon_after_a_request_s_last_chunk_is_not_taken_for_generating() -> None:
    judge = judge_with(("early", 0.0), ("later", 0.0))
    judge.chunk("early", 10.0)
    judge.chunk("later", 10.0 + LIMIT_S * SERVER_ACTIVE_FRACTION * 0.9)  # then the whole server hangs

    judgement = judge.judge("early", 10.0 + LIMIT_S)
    assert judgement.verdict is Verdict.WAIT
    assert judgement.look_again_at == 10.0 + LIMIT_S + LIMIT_S * RECHECK_FRACTION


def test_a_request_waiting_for_its_first_chunk_is_cut_only_once_a_later_one_has_started() -> None:
    # Given a request waiting (SGLang's queue, or stuck) while an earlier one streams
    judge = judge_with(("earlier", 0.0), ("waiting", 5.0))
    for second in range(1, 80):
        judge.chunk("earlier", float(second))
    # Then it is not cut, however long it waits: it may be queued behind the ones running
    assert judge.judge("waiting", 5.0 + 2 * LIMIT_S).verdict is Verdict.WAIT
    # Nor when one sent at about the same moment starts first: they may have reached the server swapped
    judge.sent("sent-together", 5.0 + SEND_ORDER_MARGIN_S / 2)
    judge.chunk("sent-together", 70.0)
    assert judge.judge("waiting", 70.0).verdict is Verdict.WAIT
    # When a request sent after it has started, it is no longer merely queued: cut
    judge.sent("sent-after", 60.0)
    judge.chunk("sent-after", 71.0)
    judgement = judge.judge("waiting", 72.0)
    assert judgement.verdict is Verdict.CUT and "no first chunk" in judgement.reason


def test_a_lone_silent_request_asks_the_server_and_is_cut_once_it_answers() -> None:
    for first_chunk in (True, False):  # silent after a chunk, or since it was sent
        judge = judge_with(("lone", 0.0))
        if first_chunk:
            judge.chunk("lone", 1.0)
        asked_at = 1.0 + LIMIT_S
        assert judge.judge("lone", asked_at).verdict is Verdict.ASK_SERVER
        # Unanswered, it is asked again later, never cut
        assert judge.judge("lone", asked_at + LIMIT_S).verdict is Verdict.ASK_SERVER
        judge.server_answered(sent_at=asked_at + LIMIT_S, now=asked_at + LIMIT_S + 0.2)
        assert judge.judge("lone", asked_at + LIMIT_S + 0.2).verdict is Verdict.CUT


class StreamingServer:
    """A fake client of a server that streams a chunk every CHUNK_INTERVAL_S to each request.

    A prompt in `silent` sends one chunk and then nothing (until it is cancelled) on that many first
    attempts; the other requests stream until the silent prompt's next attempt begins, then answer.
    One-token questions (rid `silence-probe:...`) are answered at once, or never."""

    def __init__(self, silent: dict[str, int], *, answers_questions: bool = True) -> None:
        self.silent = silent
        self.answers_questions = answers_questions
        self.attempts: Counter[str] = Counter()
        self.silences_cut: defaultdict[str, list[float]] = defaultdict(list)  # silence before each cut
        self.questions = 0
        self.question_asked = threading.Condition()
        self.retried = threading.Event()

    async def chat(
        self,
        messages: list[Message],
        sampling: SamplingSettings,
        rid: str,
        on_progress: ProgressCallback | None = None,
    ) -> ChatResult:
        assert on_progress is not None or rid.startswith(PROBE_RID_PREFIX)
        if rid.startswith(PROBE_RID_PREFIX):
            return await self._question()
        prompt_id = rid.split(":")[1]
        self.attempts[prompt_id] += 1
        assert on_progress is not None
        on_progress()
        if self.attempts[prompt_id] <= self.silent.get(prompt_id, 0):
            last_chunk_at = time.monotonic()
            try:
                await asyncio.Event().wait()
            finally:
                self.silences_cut[prompt_id].append(time.monotonic() - last_chunk_at)
        if prompt_id in self.silent:
            self.retried.set()
        while not self.retried.is_set():
            await asyncio.sleep(CHUNK_INTERVAL_S)
            on_progress()
        return answer()

    async def _question(self) -> ChatResult:
        with self.question_asked:
            self.questions += 1
            self.question_asked.notify_all()
        if not self.answers_questions:
            await asyncio.Event().wait()
        return answer()

    def wait_for_questions(self, count: int) -> None:
        with self.question_asked:
            assert self.question_asked.wait_for(lambda: self.questions >= count, timeout=WAIT_S)

    async def close(self) -> None:
        return None


def answer() -> ChatResult:
    return ChatResult(
        content="\n\nanswer",
        reasoning_content="\nthought\n",
        finish_reason="stop",
        usage=Usage(prompt_tokens=3, completion_tokens=5, reasoning_tokens=3),
        spec_accept_length=3.5,
        started_at=0.0,
        finished_at=1.0,
    )


def engine_for(server: StreamingServer) -> GenerationEngine:
    return GenerationEngine(
        lambda: server,
        max_in_flight=8,
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.001, backoff_cap_s=0.001),
        origin=Origin(host="h", gpu=0, server_url="http://sim"),
        silence_limit_s=SHORT_LIMIT_S,
    )


def test_a_request_that_falls_silent_while_others_stream_is_cut_within_the_limit_and_tried_again() -> None:
    server = StreamingServer(silent={"hung": 1})
    engine = engine_for(server)
    recorder = Recorder()
    try:
        prompts = [prompt("hung"), *(prompt(f"streams-{i}") for i in range(3))]
        job = engine.submit_batch("r", prompts, SamplingSettings(max_tokens=BUDGET), recorder)
        outcome = job.done.result(timeout=WAIT_S)
    finally:
        engine.close()

    assert (outcome.staged, outcome.dead_lettered, outcome.unreachable) == (4, 0, [])
    assert {c.prompt_id: c.attempt for c in recorder.staged}["hung"] == 2
    [silence_s] = server.silences_cut["hung"]
    assert SHORT_LIMIT_S <= silence_s < SHORT_LIMIT_S + LATENESS_S
    assert server.questions == 0  # others streamed: no need to ask the server anything


def test_a_lone_silent_request_is_cut_once_the_server_answers_a_one_token_question() -> None:
    server = StreamingServer(silent={"lone": 1})
    engine = engine_for(server)
    recorder = Recorder()
    try:
        outcome = engine.submit_batch("r", [prompt("lone")], SamplingSettings(), recorder).done.result(WAIT_S)
    finally:
        engine.close()

    assert (outcome.staged, [c.attempt for c in recorder.staged]) == (1, [2])
    assert server.questions == 1


def test_a_lone_silent_request_on_a_server_that_answers_nothing_is_left_to_liveness() -> None:
    # Given a lone request that falls silent on a server that answers no question either
    server = StreamingServer(silent={"lone": ALWAYS}, answers_questions=False)
    engine = engine_for(server)
    try:
        job = engine.submit_batch("r", [prompt("lone")], SamplingSettings(), Recorder())
        # When the watch has asked twice (the second only once the first went unanswered)
        server.wait_for_questions(2)
        # Then the request was never cut, and liveness's suspension is what gives it back
        assert server.attempts["lone"] == 1
        engine.suspend("server hung")
        outcome = job.done.result(timeout=WAIT_S)
    finally:
        engine.close()
    assert outcome.unreachable == ["lone"] and server.silences_cut["lone"] != []
