"""Trials of suspected poison prompts in the generation engine, with a fake server: a suspect is sent alone
after a canary, convicted only when the server fails with it alone, comes back and had shown its control;
outages, silence while others stream and a worker's own stop convict nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from core.records import Message, Origin, SamplingSettings
from devstack.local_stack import wait_until
from inference.chat_stream import ChatResult, ProgressCallback
from inference.errors import FailureCause, InferenceUnavailable
from tests.support.handover import Recorder
from tests.support.records import prompt
from tests.unit.test_generation import FakeServer
from tests.unit.test_poison import trial
from workers.generate import trials
from workers.generate.generation import REASON_POISON, BatchOutcome, GenerationEngine, RetryPolicy
from workers.generate.liveness import Liveness, Outage
from workers.generate.silence import PROBE_RID_PREFIX
from workers.generate.trials import TrialSettings, control_window_s
from workers.state.poison import (
    MIN_TIMING_S,
    Evidence,
    Outcome,
    PoisonPolicy,
    Suspicion,
    TrialBegun,
    TrialEnd,
    TrialEnded,
    Verdict,
)

ATTEMPTS = 3  # the README's DRAFTGEN_MAX_ATTEMPTS
RESTART_EVERY_S = 0.2
EARLIER_RESTARTS = 40
SLOW_MACHINE_S = 3.0  # a busy machine's delay on top of the bound, in all
CANARY_EVERY_S = 0.2
HUNG_FOR_S = 0.5  # the server made no progress since shortly after the suspect was sent
LONG_TRIAL_S = 4.0  # longer than three times a control of 1 s
WINDOW = 4
WAIT_S = 10.0
QUICK = PoisonPolicy(control_factor=0.0)  # no control to wait for: any server shows it at once
QUICK_TRIALS = TrialSettings(silence_limit_s=5.0, timing_floor_s=0.001, comeback_limit_s=WAIT_S)


class TrialServer(FakeServer):
    """Answers a prompt once the test releases it. Some prompts drop their connection every time; some
    crash the server (their connection drops, and the server refuses the next `crash_canaries` canaries;
    None: until the test brings it back); some wedge it (their request hangs, and the test plays the
    liveness watch). While `down`, the one-token canary is refused. Records how many requests ran beside
    each one sent."""

    def __init__(
        self,
        *,
        drops: frozenset[str] = frozenset(),
        crashes: frozenset[str] = frozenset(),
        crash_canaries: int | None = 1,
        wedges: frozenset[str] = frozenset(),
        timeouts: frozenset[str] = frozenset(),
        drops_after_s: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        self.drops = drops
        self.crashes = crashes
        self.crash_canaries = crash_canaries
        self.wedges = wedges
        self.timeouts = timeouts  # they time out at the client, the server wedged (no canary until back)
        self.drops_after_s = drops_after_s or {}  # they lose their connection this long in
        self.down = False
        self.refuse_canaries: int | None = 0  # None: every one while down
        self.running_beside: dict[str, list[int]] = {}
        self.canaries = 0

    async def chat(
        self,
        messages: list[Message],
        sampling: SamplingSettings,
        rid: str,
        on_progress: ProgressCallback | None = None,
    ) -> ChatResult:
        if rid.startswith(PROBE_RID_PREFIX):
            self.canaries += 1
            if self.down:
                if self.refuse_canaries is not None:
                    self.refuse_canaries -= 1
                    self.down = self.refuse_canaries > 0
                raise InferenceUnavailable("connection refused", cause=FailureCause.REFUSED)
            self.releaser("probe").set()
            return await super().chat(messages, sampling, f"{PROBE_RID_PREFIX}:probe", on_progress)
        prompt_id = rid.split(":")[1]
        self.running_beside.setdefault(prompt_id, []).append(self.running)
        if prompt_id in self.drops or prompt_id in self.crashes:
            self.started.append(prompt_id)
            await asyncio.sleep(0)
            if prompt_id in self.crashes:
                self.down, self.refuse_canaries = True, self.crash_canaries
            raise InferenceUnavailable("the connection was reset", cause=FailureCause.DROPPED)
        if prompt_id in self.drops_after_s:
            self.started.append(prompt_id)
            await asyncio.sleep(self.drops_after_s[prompt_id])
            raise InferenceUnavailable("the connection was reset", cause=FailureCause.DROPPED)
        if prompt_id in self.timeouts:
            self.started.append(prompt_id)
            self.down, self.refuse_canaries = True, None
            raise InferenceUnavailable("Request timed out.", cause=FailureCause.TIMED_OUT)
        if prompt_id in self.wedges:
            self.started.append(prompt_id)
            await asyncio.get_running_loop().create_future()  # never answered: liveness gives it up
        return await super().chat(messages, sampling, rid, on_progress)


def engine_over(
    server: FakeServer, *, policy: PoisonPolicy = QUICK, trials: TrialSettings = QUICK_TRIALS
) -> GenerationEngine:
    return GenerationEngine(
        lambda: server,
        max_in_flight=WINDOW,
        retry=RetryPolicy(max_attempts=ATTEMPTS, backoff_base_s=0.001, backoff_cap_s=0.001),
        origin=Origin(host="h", gpu=0, server_url="http://gpu0"),
        server_identity="gpu0",
        poison=policy,
        trials=trials,
    )


@pytest.fixture
def engines() -> Iterator[list[GenerationEngine]]:
    started: list[GenerationEngine] = []
    yield started
    for engine in started:
        engine.close()


def answering(server: FakeServer, *prompt_ids: str) -> None:
    for prompt_id in prompt_ids:
        server.releaser(prompt_id).set()


def suspected(recorder: Recorder, prompt_id: str, times: int = 2, cause: str = "hung") -> None:
    for _ in range(times):
        recorder.strike(
            prompt_id, Suspicion(life="h/gpu0#x.0", cause=cause, with_server=True, at=time.time())
        )


def ended(recorder: Recorder, prompt_id: str) -> list[TrialEnded]:
    return [e for e in recorder.strikes.get(prompt_id, []) if isinstance(e, TrialEnded)]


def outcomes(recorder: Recorder, prompt_id: str) -> list[Outcome]:
    return [QUICK.outcome(e) for e in ended(recorder, prompt_id)]


def test_a_prompt_in_flight_when_the_server_failed_is_only_suspected_then_acquitted_alone(
    engines: list[GenerationEngine],
) -> None:
    # Given a prompt whose requests were in flight twice when the server went down, and an answering server
    server = TrialServer()
    answering(server, "a", "p", "b")
    engines.append(engine_over(server))
    recorder = Recorder()
    suspected(recorder, "p", cause="dropped")
    # When its batch comes again
    outcome = engines[0].submit_batch(
        "r", [prompt("a"), prompt("p"), prompt("b")], SamplingSettings(), recorder
    )
    # Then it is tried alone, completes, and is staged with the others; nothing is dead-lettered
    assert outcome.outcome().staged == 3 and recorder.dead == []
    assert server.running_beside["p"] == [0]
    assert outcomes(recorder, "p") == [Outcome.ACQUITTED]
    assert QUICK.judge(recorder.strikes["p"]) is Verdict.AS_USUAL


def test_a_suspect_dropped_alone_three_times_after_canaries_is_dead_lettered_with_its_trials(
    engines: list[GenerationEngine],
) -> None:
    # Given a prompt whose connection drops every time, on a server that answers everything else
    server = TrialServer(drops=frozenset({"bad"}))
    answering(server, "a", "b")
    engines.append(engine_over(server))
    recorder = Recorder()
    # When its batch is delivered, and once more after the first delivery leaves it pending
    first = engines[0].submit_batch(
        "r", [prompt("a"), prompt("bad"), prompt("b")], SamplingSettings(), recorder
    )
    assert first.outcome().unreachable == ["bad"]  # two suspicions in company, one trial: not proven yet
    second = engines[0].submit_batch("r", [prompt("bad")], SamplingSettings(), recorder).outcome()
    # Then it was tried alone three times, each a conviction, and dead-lettered saying so
    assert second.dead_lettered == 1
    assert server.running_beside["bad"][2:] == [0, 0, 0]  # its trials: nothing else in flight
    assert outcomes(recorder, "bad") == [Outcome.CONVICTED] * 3
    (letter,) = recorder.dead
    assert letter.reason == REASON_POISON
    assert letter.error.startswith("no answer alone 3 times, the server answering a canary before and after")
    assert letter.error.count("its connection dropped while the server still answered") == 3
    assert letter.error.endswith("suspected after: dropped (2)")
    assert sorted(c.prompt_id for c in recorder.staged) == ["a", "b"]


def test_outages_while_a_suspect_runs_alone_convict_nothing_on_a_server_that_fails_as_often(
    engines: list[GenerationEngine],
) -> None:
    # Given a rule whose control for a failure as fast as can be timed is 1 s, a suspect that takes the
    # server down alone, and a server that restarts by itself every RESTART_EVERY_S (its liveness watch sees
    # each restart): it never shows the control, so each trial comes at the end of the suspect's wait
    server = TrialServer(crashes=frozenset({"p"}))
    policy = PoisonPolicy(control_factor=4.0)
    engine = engine_over(server, policy=policy, trials=TrialSettings(timing_floor_s=0.001))
    engines.append(engine)
    recorder = Recorder()
    suspected(recorder, "p", cause="dropped")
    stop = threading.Event()

    def restarting_by_itself() -> None:
        while not stop.wait(RESTART_EVERY_S):
            engine.note_restart("the server restarted by itself", started_at=time.time())

    restarts = threading.Thread(target=restarting_by_itself, daemon=True)
    restarts.start()
    try:
        # When the suspect is tried alone and the server goes down with it each time
        outcome = engine.submit_batch("r", [prompt("p")], SamplingSettings(), recorder).outcome()
    finally:
        stop.set()
        restarts.join()
    # Then its trials are void, for the server fails as fast without it; none convicts
    assert outcome.unreachable == ["p"] and recorder.dead == []
    assert len(ended(recorder, "p")) == ATTEMPTS
    assert {policy.outcome(e) for e in ended(recorder, "p")} == {Outcome.VOID}
    assert "without failing" in policy.why(ended(recorder, "p")[0])
    # And once the server holds up, the suspect completes alone and is acquitted
    server.crashes = frozenset()
    answering(server, "p")
    assert engine.submit_batch("r", [prompt("p")], SamplingSettings(), recorder).outcome().staged == 1
    assert policy.outcome(ended(recorder, "p")[-1]) is Outcome.ACQUITTED and recorder.dead == []


def wedged_three_times(
    engines: list[GenerationEngine], server: TrialServer, *, hung: Callable[[int], bool], stalled_ago_s: float
) -> tuple[BatchOutcome, list[TrialEnded]]:
    """Suspect `w`'s delivery, the test playing the liveness watch at each of its trials: once `hung(tried)`
    holds, it finds the server hung (no progress for `stalled_ago_s`), restarts it and resumes the engine.
    The delivery's outcome, and the trials recorded."""
    engine = engine_over(server)
    engines.append(engine)
    recorder = Recorder()
    suspected(recorder, "w")
    job = engine.submit_batch("r", [prompt("w")], SamplingSettings(), recorder)
    for tried in range(1, ATTEMPTS + 1):
        wait_until(partial(hung, tried), timeout_s=WAIT_S, what=f"trial {tried} alone")
        engine.suspend(
            "server hung", Outage(Liveness.HUNG.value, stalled_since=time.monotonic() - stalled_ago_s)
        )
        server.down = False  # the server restarted and generates again
        engine.resume()
    return job.outcome(), ended(recorder, "w")


def test_a_suspect_that_wedges_the_server_alone_three_times_is_dead_lettered_each_trial_a_server_life(
    engines: list[GenerationEngine],
) -> None:
    # Given a suspect that wedges the server whenever it runs
    server = TrialServer(wedges=frozenset({"w"}))

    # When the liveness watch finds the server hung with it alone, restarts the server and resumes
    def alone(tried: int) -> bool:
        return server.started.count("w") == tried

    outcome, convictions = wedged_three_times(engines, server, hung=alone, stalled_ago_s=0.0)
    # Then each trial convicts: the server stopped making progress with it alone, and answered a canary
    # after; and three convictions dead-letter it, in one delivery
    assert outcome.dead_lettered == 1
    assert [(t.ended, QUICK.outcome(t)) for t in convictions] == [(TrialEnd.WEDGED, Outcome.CONVICTED)] * 3
    assert all(t.canary_after_s is not None for t in convictions)
    assert all(t.failed_after_s < 1.0 for t in convictions)  # when progress stopped, not when it was seen
    assert len({t.life for t in convictions}) == 3  # each wedge ended a life of the server


def test_a_trial_whose_server_never_comes_back_is_void(engines: list[GenerationEngine]) -> None:
    # Given a suspect that takes the server down, and a server that does not come back
    server = TrialServer(crashes=frozenset({"p"}), crash_canaries=None)
    trials = TrialSettings(timing_floor_s=0.001, comeback_limit_s=0.3)
    engines.append(engine_over(server, trials=trials))
    recorder = Recorder()
    suspected(recorder, "p")
    # When it is tried
    outcome = engines[0].submit_batch("r", [prompt("p")], SamplingSettings(), recorder).outcome()
    # Then the trial is void: the server was broken, not (as far as anyone can tell) the prompt
    first = ended(recorder, "p")[0]
    assert (first.ended, first.canary_after_s) == (TrialEnd.WENT_DOWN, None)
    assert QUICK.outcome(first) is Outcome.VOID
    assert outcome.unreachable == ["p"] and recorder.dead == []


def test_a_trial_cut_short_by_the_worker_is_void_and_one_its_dead_worker_left_open_counts_for_nothing(
    engines: list[GenerationEngine],
) -> None:
    # Given a suspect with two convictions and a trial its previous worker began and never ended (killed)
    recorder = Recorder()
    suspected(recorder, "p")
    for _ in range(2):
        recorder.strike("p", trial(TrialEnd.WENT_DOWN, failed_after_s=0.1, life="h/gpu0#y.3"))
    recorder.strike(
        "p",
        TrialBegun(
            trial="open",
            life="h/gpu0#y.4",
            started_at=time.time(),
            canary_before_s=0.0,
            control_s=1e4,
            mean_up_s=1e4,
        ),
    )
    assert QUICK.judge(recorder.strikes["p"]) is Verdict.TRIAL
    # When this worker tries it, the server goes down with it, and the worker stops before it is back
    server = TrialServer(crashes=frozenset({"p"}), crash_canaries=None)
    engine = engine_over(server)
    engines.append(engine)
    job = engine.submit_batch("r", [prompt("p")], SamplingSettings(), recorder)
    wait_until(lambda: server.canaries >= 2, timeout_s=WAIT_S, what="the worker waiting for the server")
    engine.drain(grace_s=0.0)
    # Then that trial is void too: the prompt goes back pending, not dead-lettered
    assert job.outcome().unreachable == ["p"] and recorder.dead == []
    assert ended(recorder, "p")[-1].ended is TrialEnd.GIVEN_UP
    assert QUICK.judge(recorder.strikes["p"]) is Verdict.TRIAL


def test_silence_while_others_stream_and_drops_while_the_server_answers_only_make_a_suspect(
    engines: list[GenerationEngine],
) -> None:
    """SGLang's retraction (a request silent while others generate) and a proxy's idle timeout (its
    connection closed while the server answers) are suspicions: the prompt completes alone."""
    server = TrialServer()
    answering(server, "a", "r", "b")
    server.failures["r"] = [
        InferenceUnavailable("silent for 30 s while the server generated", cause=FailureCause.SILENT),
        InferenceUnavailable("the connection was closed by the proxy", cause=FailureCause.DROPPED),
    ]
    engines.append(engine_over(server))
    recorder = Recorder()
    outcome = engines[0].submit_batch(
        "r", [prompt("a"), prompt("r"), prompt("b")], SamplingSettings(), recorder
    )
    assert outcome.outcome().staged == 3 and recorder.dead == []
    suspicions = [e for e in recorder.strikes["r"] if isinstance(e, Suspicion)]
    assert [(s.cause, s.with_server) for s in suspicions] == [("silent", False), ("dropped", False)]
    assert outcomes(recorder, "r") == [Outcome.ACQUITTED]
    assert server.running_beside["r"][-1] == 0


def test_suspects_are_tried_one_after_the_other_and_ordinary_prompts_never_run_beside_them(
    engines: list[GenerationEngine],
) -> None:
    server = TrialServer()
    ids = ["s1", "o1", "s2", "o2", "s3", "o3"]
    answering(server, *ids)
    recorder = Recorder()
    for suspect in ("s1", "s2", "s3"):
        suspected(recorder, suspect)
    engines.append(engine_over(server))
    outcome = engines[0].submit_batch("r", [prompt(i) for i in ids], SamplingSettings(), recorder).outcome()
    assert outcome.staged == len(ids)
    assert all(server.running_beside[s] == [0] for s in ("s1", "s2", "s3"))
    # the suspects waiting went one after the other: no ordinary request between them to drain again
    sent = [p for p in server.started if p in ids]
    assert sent[:3] == ["s1", "s2", "s3"], sent


def test_a_record_that_already_proves_a_prompt_poison_dead_letters_it_without_a_request(
    engines: list[GenerationEngine],
) -> None:
    server = TrialServer()
    engines.append(engine_over(server))
    recorder = Recorder()
    proof: list[Evidence] = [trial(TrialEnd.WEDGED, life=f"h/gpu0#y.{i}") for i in range(3)]
    recorder.strikes["p"] = proof  # its worker died between the third conviction and the dead letter
    outcome = engines[0].submit_batch("r", [prompt("p")], SamplingSettings(), recorder).outcome()
    assert outcome.dead_lettered == 1 and "p" not in server.started


def test_a_poison_prompt_among_a_run_s_last_is_dead_lettered_alone_however_often_its_server_failed_before(
    engines: list[GenerationEngine],
) -> None:
    # Given a rule whose control for a failure as fast as can be timed is 1 s (its window: 3 s), a server
    # whose liveness watch saw it restart EARLIER_RESTARTS times a moment ago, and the run's last prompt, a
    # suspect that drops its connection every time, with nothing else to run
    server = TrialServer(drops=frozenset({"bad"}))
    policy = PoisonPolicy(control_factor=4.0)
    engine = engine_over(server, policy=policy, trials=TrialSettings(timing_floor_s=MIN_TIMING_S))
    engines.append(engine)
    for _ in range(EARLIER_RESTARTS):
        engine.note_restart("the server restarted", started_at=time.time())
        time.sleep(0.001)
    recorder = Recorder()
    suspected(recorder, "bad", cause="dropped")
    started = time.monotonic()
    # When its batch is delivered
    outcome = engine.submit_batch("r", [prompt("bad")], SamplingSettings(), recorder).outcome()
    # Then it is tried alone three times, each a conviction, and dead-lettered in this one delivery: the
    # earlier failures leave the server's record within one window, and no trial waits longer
    took_s = time.monotonic() - started
    window_s = control_window_s(policy.control_needed_s(MIN_TIMING_S))
    assert outcome.dead_lettered == 1 and [e.reason for e in recorder.dead] == [REASON_POISON]
    assert [policy.outcome(e) for e in ended(recorder, "bad")] == [Outcome.CONVICTED] * 3
    assert took_s <= ATTEMPTS * window_s + SLOW_MACHINE_S, took_s


def test_a_suspect_waiting_for_its_control_on_an_idle_server_asks_it_canaries_meanwhile(
    engines: list[GenerationEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a suspect that completes alone, whose control is 2 s, on a server that restarted a moment ago
    # and has nothing else to run (a control canary every CANARY_EVERY_S instead of every 10 s)
    monkeypatch.setattr(trials, "CONTROL_CANARY_INTERVAL_S", CANARY_EVERY_S)
    server = TrialServer()
    policy = PoisonPolicy(control_factor=8.0)
    engine = engine_over(server, policy=policy, trials=TrialSettings(timing_floor_s=MIN_TIMING_S))
    engines.append(engine)
    engine.note_restart("the server restarted", started_at=time.time())
    recorder = Recorder()
    suspected(recorder, "p", cause="dropped")
    answering(server, "p")
    # When it waits for its control
    assert engine.submit_batch("r", [prompt("p")], SamplingSettings(), recorder).outcome().staged == 1
    # Then the server answered canaries all along the wait, before the one just ahead of the trial, and the
    # trial began once it had worked the control
    needed_s = policy.control_needed_s(MIN_TIMING_S)
    (acquittal,) = ended(recorder, "p")
    assert acquittal.control_s >= needed_s
    assert server.canaries >= needed_s / CANARY_EVERY_S / 2  # half of them, on a busy machine


def test_a_wedge_whose_request_times_out_first_is_convicted_as_a_wedge_timed_by_the_liveness_watch(
    engines: list[GenerationEngine],
) -> None:
    # Given a suspect that wedges the server, and a client timeout shorter than the liveness stall window:
    # its request times out first, and the server answers no canary until the watch restarts it
    server = TrialServer(timeouts=frozenset({"w"}))

    # When the request times out alone, and the watch then finds the server hung, restarts it, resumes
    def timed_out(tried: int) -> bool:
        return server.started.count("w") == tried and server.down

    outcome, convictions = wedged_three_times(engines, server, hung=timed_out, stalled_ago_s=HUNG_FOR_S)
    # Then each trial is a wedge, timed when progress stopped (not at the client's timeout), and convicts
    assert outcome.dead_lettered == 1
    assert [(t.ended, QUICK.outcome(t)) for t in convictions] == [(TrialEnd.WEDGED, Outcome.CONVICTED)] * 3


def test_a_suspect_tried_after_another_s_long_trial_waits_for_its_own_control_first(
    engines: list[GenerationEngine],
) -> None:
    """The benchmark at the defaults: a suspect whose wait for its control ran out while another's trial held
    the server (a 300 s silence or wedge) was tried at once after it, with no control, void: a wasted trial
    (a wedge's, five minutes and a restart). It waits for its control afresh after the other's trial."""
    # Given two suspects of one batch: one convicted twice already, that drops its connection LONG_TRIAL_S
    # into its next trial (longer than the other's wait for its control may last), one that drops it at once
    server = TrialServer(drops=frozenset({"quick"}), drops_after_s={"slow": LONG_TRIAL_S})
    policy = PoisonPolicy(control_factor=4.0)
    engine = engine_over(server, policy=policy, trials=TrialSettings(timing_floor_s=MIN_TIMING_S))
    engines.append(engine)
    recorder = Recorder()
    suspected(recorder, "slow", cause="dropped")
    for _ in range(2):  # at once those times: its next trial waits for a short control too
        recorder.strike("slow", trial(TrialEnd.DROPPED, failed_after_s=0.0))
    suspected(recorder, "quick", cause="dropped")
    # When their batch is delivered (the slow one's later trials, after a slow failure, wait long: not here)
    job = engine.submit_batch("r", [prompt("slow"), prompt("quick")], SamplingSettings(), recorder)
    wait_until(
        lambda: len(ended(recorder, "quick")) == ATTEMPTS, timeout_s=WAIT_S, what="the quick one's trials"
    )
    engine.drain(grace_s=0.0)  # the worker stops: the slow one's batch goes back
    job.outcome()
    # Then every trial of the quick one began once its server had shown the control it waited for, and
    # each convicted: none was tried at once, short of it, after the slow one's trial
    needed_s = policy.control_needed_s(MIN_TIMING_S)
    quick = ended(recorder, "quick")
    assert quick and all(t.control_s >= needed_s for t in quick), quick
    assert [policy.outcome(t) for t in quick] == [Outcome.CONVICTED] * len(quick)
