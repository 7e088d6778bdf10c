"""The poison rule as a pure function of a prompt's record: suspicions never convict, a trial convicts only
with a canary before and after and a control as long as it needs, three convictions dead-letter, a trial
completed acquits; and the record read back from Redis is bounded, its bad lines no evidence."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from inference.errors import FailureCause, InferenceUnavailable
from workers.generate.liveness import DEFAULT_LIVENESS_POLL_S, Liveness, Outage
from workers.generate.trials import (
    RECORD_MAX_ENTRIES,
    Steadiness,
    TrialSettings,
    control_window_s,
    failed_after_s,
    retimed,
    trial_end,
)
from workers.state.poison import (
    CONTROL_WAIT_FACTOR,
    EVIDENCE_READ_MAX_BYTES,
    MIN_TIMING_S,
    NEXT_FAILURE_HEADROOM,
    Evidence,
    Outcome,
    PoisonPolicy,
    Suspicion,
    TrialBegun,
    TrialEnd,
    TrialEnded,
    Verdict,
    decode_evidence,
    describe,
    encode_evidence,
)

POLICY = PoisonPolicy()  # the defaults: 2 suspicions make a suspect, 3 convictions a poison, control x20
STEADY_S = 3600.0  # an hour of work without failing before a trial: ample control
OUTAGE_NOTICED_S = 1e-6  # a wait that an outage interrupts ends just after it


def suspicion(*, with_server: bool = True, cause: str = "dropped") -> Suspicion:
    return Suspicion(life="h/gpu0#a.1", cause=cause, with_server=with_server, at=1.7e9)


def trial(
    ending: TrialEnd = TrialEnd.WEDGED,
    *,
    failed_after_s: float = 0.4,
    control_s: float = STEADY_S,
    mean_up_s: float = STEADY_S,
    canary_before_s: float = 0.01,
    canary_after_s: float | None = 3.0,
    life: str = "h/gpu0#a.2",
) -> TrialEnded:
    return TrialEnded(
        trial=f"t{random.random()}",
        life=life,
        started_at=1.7e9,
        canary_before_s=canary_before_s,
        control_s=control_s,
        mean_up_s=mean_up_s,
        ended=ending,
        failed_after_s=failed_after_s,
        canary_after_s=canary_after_s,
    )


def test_suspicions_alone_make_a_suspect_and_never_a_poison() -> None:
    assert POLICY.judge([suspicion()]) is Verdict.AS_USUAL
    assert POLICY.judge([suspicion(), suspicion(with_server=False, cause="silent")]) is Verdict.TRIAL
    thousand = [suspicion(with_server=i % 2 == 0, cause="silent" if i % 3 else "hung") for i in range(1000)]
    assert POLICY.judge(thousand) is Verdict.TRIAL


def test_three_convictions_dead_letter_a_prompt_and_two_do_not() -> None:
    two: list[Evidence] = [suspicion(), suspicion(), trial(), trial(TrialEnd.WENT_DOWN)]
    assert POLICY.judge(two) is Verdict.TRIAL
    assert POLICY.judge([*two, trial(TrialEnd.DROPPED)]) is Verdict.DEAD


@pytest.mark.parametrize(
    ("why", "unproven"),
    [
        ("the server never answered a canary again", trial(canary_after_s=None)),
        ("its canary was not just before", trial(canary_before_s=60.0)),
        ("the worker gave it up", trial(TrialEnd.GIVEN_UP)),
        (
            "the server had not worked 20x as long as the suspect took to fail",
            trial(failed_after_s=10.0, control_s=150.0),
        ),
        ("the server fails every 150 s on average", trial(failed_after_s=10.0, mean_up_s=150.0)),
        ("a zero-second failure still needs 5 s of control", trial(failed_after_s=0.0, control_s=4.9)),
    ],
)
def test_a_trial_without_every_proof_is_void_and_counts_for_nothing(why: str, unproven: TrialEnded) -> None:
    assert POLICY.outcome(unproven) is Outcome.VOID, why
    record: list[Evidence] = [trial(), trial(), *[unproven] * 10]
    assert POLICY.judge(record) is Verdict.TRIAL, why


def test_the_control_a_conviction_needs_is_twenty_times_how_fast_the_suspect_failed() -> None:
    assert POLICY.outcome(trial(failed_after_s=10.0, control_s=200.0)) is Outcome.CONVICTED
    assert POLICY.outcome(trial(failed_after_s=10.0, control_s=199.0)) is Outcome.VOID
    assert POLICY.control_needed_s(0.0) == 20 * MIN_TIMING_S
    # before its next trial, a suspect waits for the control its last failure needs, or a wedge's timing
    assert POLICY.control_before_trial_s([suspicion(), suspicion()], timing_floor_s=5.0) == 100.0
    assert POLICY.control_before_trial_s([trial(failed_after_s=30.0)], timing_floor_s=5.0) == (
        20 * 30.0 * NEXT_FAILURE_HEADROOM
    )


def test_a_wedge_timed_up_to_a_poll_late_still_convicts_after_the_control_its_suspect_waited_for() -> None:
    """The liveness watch times a wedge by its last poll that saw progress: one just after the trial began
    can still see the work before it, and a busy machine polls late."""
    poll_s = 0.25
    settings = TrialSettings.for_liveness(stall_s=3.0, poll_s=poll_s)
    waited_for_s = POLICY.control_before_trial_s([suspicion(), suspicion()], settings.timing_floor_s)
    late = trial(failed_after_s=poll_s * 1.9, control_s=waited_for_s, mean_up_s=waited_for_s)
    assert POLICY.outcome(late) is Outcome.CONVICTED


def test_a_trial_the_suspect_completes_acquits_it_of_everything_before() -> None:
    completed = trial(TrialEnd.COMPLETED)
    record: list[Evidence] = [suspicion(), suspicion(), trial(), trial(), completed]
    assert POLICY.outcome(completed) is Outcome.ACQUITTED
    assert POLICY.judge(record) is Verdict.AS_USUAL
    assert POLICY.judge([*record, trial(), trial()]) is Verdict.TRIAL  # three new ones are needed
    assert POLICY.judge([*record, trial(), trial(), trial()]) is Verdict.DEAD


def test_a_trial_begun_and_never_ended_its_worker_died_is_void() -> None:
    begun = [
        TrialBegun(
            trial=f"t{i}",
            life="h/gpu0#a.2",
            started_at=1.7e9,
            canary_before_s=0.0,
            control_s=1e4,
            mean_up_s=1e4,
        )
        for i in range(3)
    ]
    record: list[Evidence] = [suspicion(), suspicion(), trial(), trial(), *begun]
    assert POLICY.judge(record) is Verdict.TRIAL
    assert "4 more trials void" in describe([*record, trial(canary_after_s=None)], POLICY)


def test_a_poison_prompt_s_letter_describes_each_trial() -> None:
    record: list[Evidence] = [
        suspicion(cause="hung"),
        suspicion(cause="hung"),
        trial(TrialEnd.WEDGED, failed_after_s=0.3, life="h/gpu0#a.2"),
        trial(TrialEnd.WENT_DOWN, failed_after_s=1.5, canary_after_s=42.0, life="h/gpu1#b.4"),
        trial(TrialEnd.DROPPED, failed_after_s=2.0, life="h/gpu1#b.4"),
    ]
    letter = describe(record, POLICY)
    assert letter.startswith("no answer alone 3 times, the server answering a canary before and after each: ")
    assert (
        "on h/gpu0 (life h/gpu0#a.2) at 2023-11-14T22:13:20Z, the server stopped making progress 0.3 s in"
        in letter
    )
    assert (
        "the server went down 1.5 s in (canary 0.0 s before, back 42.0 s after; 3600 s without failing"
        in letter
    )
    assert "3600 s without failing before, 3600 s between failures)" in letter
    assert "its connection dropped while the server still answered 2.0 s in" in letter
    assert letter.endswith("suspected after: hung with the server (2)")


def test_a_record_read_back_from_redis_is_bounded_and_its_bad_lines_are_no_evidence() -> None:
    good: list[Evidence] = [suspicion(), trial()]
    raw = b"".join(encode_evidence(event) + b"\n" for event in good)
    assert decode_evidence(raw) == good
    noisy = (
        b'not json\n{"type":"verdict"}\n[{"life":"old format"}]\n' + raw + b'{"type":"suspicion","life":1}\n'
    )
    assert decode_evidence(noisy) == good
    assert decode_evidence(raw + b" " * EVIDENCE_READ_MAX_BYTES) == []  # not ours: no evidence at all
    assert decode_evidence(None) == [] and decode_evidence(b"") == []


def test_an_ordinary_prompt_on_a_server_failing_at_random_is_convicted_by_under_1_in_20_trials() -> None:
    """The bound the doc states. A server whose outages are a Poisson process of any rate, watched as a
    worker watches it (`Steadiness`); trials of an ordinary prompt (14 s alone) start at random moments
    once the control their gate asks for is shown; an outage during one convicts it only when it came
    within 1/20 of the control. Simulated from one outage a minute to one a day."""
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    trial_s, restart_s, floor_s = 14.0, 60.0, DEFAULT_LIVENESS_POLL_S
    needed_s = POLICY.control_needed_s(floor_s)
    window_s = control_window_s(needed_s)
    per_trial = 1 - math.exp(-1 / POLICY.control_factor)
    for mean_between_outages_s in (60.0, 600.0, 3600.0, 86400.0):
        server = Steadiness(since=0.0)
        now, next_outage = 0.0, rng.expovariate(1 / mean_between_outages_s)
        convictions = trials = 0
        while trials < 5_000:
            now += rng.expovariate(1 / 30.0)  # a suspect arrives; it waits for the control it needs
            until = now + CONTROL_WAIT_FACTOR * needed_s
            while True:  # the Court's wait (trials.Court._wait_s), outages falling as they fall
                if next_outage < now:
                    server.failed(next_outage, server_down=True)
                    server.back(next_outage + restart_s)
                    now = max(now, next_outage + restart_s)
                    next_outage = now + rng.expovariate(1 / mean_between_outages_s)
                    continue
                ready = server.ready_at(now, needed_s, window_s)
                if now >= until or (ready is not None and not now < ready <= until):
                    break
                now = min(until if ready is None else ready, next_outage + OUTAGE_NOTICED_S)
            trials += 1
            control_s, mean_up_s = server.control_s(now), server.mean_up_s(now, window_s)
            server.trial_began(now)
            if next_outage - now >= trial_s:
                server.trial_completed()
                continue
            ended = trial(
                TrialEnd.WENT_DOWN, failed_after_s=next_outage - now, control_s=control_s, mean_up_s=mean_up_s
            )
            convictions += POLICY.outcome(ended) is Outcome.CONVICTED
            server.trial_failed(next_outage, server_down=True)
            server.back(next_outage + restart_s)
            now = next_outage + restart_s
            next_outage = now + rng.expovariate(1 / mean_between_outages_s)
        print(f"one outage per {mean_between_outages_s:.0f} s: {convictions} convictions in {trials} trials")
        # at most the bound, three standard deviations allowed at 5,000 trials
        allowed = per_trial + 3 * math.sqrt(per_trial / trials)
        assert convictions / trials <= allowed, (mean_between_outages_s, convictions, seed)


def test_a_server_s_record_counts_each_outage_once_and_leaves_trials_out() -> None:
    server = Steadiness(since=0.0)
    # an outage that takes 48 requests down is one failure; the server is back 30 s later
    for _ in range(48):
        server.failed(100.0, server_down=True)
    server.back(130.0)
    assert (server.failures, server.lives, server.control_s(140.0)) == (1, 1, 10.0)
    assert server.mean_up_s(140.0) == (100.0 + 10.0) / 2
    # a trial that takes the server down is left out: its time, and its failure
    server.trial_began(150.0)
    server.trial_failed(151.0, server_down=True)
    server.back(160.0)
    assert server.failures == 1 and server.mean_up_s(170.0) == (100.0 + 20.0 + 10.0) / 2
    # the liveness watch seeing, later, the restart the worker waited for tells nothing new
    server.restarted(155.0)
    assert server.failures == 1 and server.control_s(170.0) == 10.0
    # a restart it never saw is a failure, and the server's new life is the stretch
    server.restarted(200.0)
    assert server.failures == 2 and server.control_s(205.0) == 5.0


def test_before_its_next_trial_a_suspect_waits_for_the_control_its_last_failure_needs_as_timed() -> None:
    floor_s, headroom = 10.0, NEXT_FAILURE_HEADROOM
    suspected = [suspicion(), suspicion()]
    # a first trial: a failure as fast as a wedge can be timed
    assert POLICY.control_before_trial_s(suspected, floor_s) == 20 * floor_s
    # then as its last failure was timed, with headroom for the next one coming a little later: a drop
    # or a silence to the chunk (no floor but the shortest timing), a wedge by the polls, a worker's death
    # up to its successor's start
    dropped, silent = trial(TrialEnd.DROPPED, failed_after_s=0.0), trial(TrialEnd.SILENT, failed_after_s=2.0)
    assert POLICY.control_before_trial_s([*suspected, dropped], floor_s) == 20 * MIN_TIMING_S
    assert POLICY.control_before_trial_s([*suspected, silent], floor_s) == 20 * 2.0 * headroom
    wedged = trial(TrialEnd.WEDGED, failed_after_s=0.5)
    assert POLICY.control_before_trial_s([*suspected, wedged], floor_s) == 20 * floor_s
    killed = trial(TrialEnd.KILLED, failed_after_s=12.0)
    assert POLICY.control_before_trial_s([*suspected, killed], floor_s) == 20 * 12.0 * headroom
    # the last failed trial's: a slow one (its worker killed by something else, say) holds up only the
    # next, and a trial given up tells nothing of the timing
    slow = trial(TrialEnd.KILLED, failed_after_s=200.0)
    given_up = trial(TrialEnd.GIVEN_UP, failed_after_s=0.0)
    assert (
        POLICY.control_before_trial_s([*suspected, wedged, slow, given_up], floor_s) == 20 * 200.0 * headroom
    )
    assert POLICY.control_before_trial_s([*suspected, slow, wedged, given_up], floor_s) == 20 * floor_s


def test_a_drop_a_little_later_than_the_last_still_convicts_after_the_control_its_suspect_waited_for() -> (
    None
):
    """The benchmark at the defaults: a drop 0.25 s in made the next trial wait 5 s of control, and the next
    drop came 0.29 s in (needing 5.7 s): void, another trial. With the headroom it convicts."""
    last = trial(TrialEnd.DROPPED, failed_after_s=0.25)
    waited_s = POLICY.control_before_trial_s([suspicion(), suspicion(), last], timing_floor_s=10.0)
    later = trial(TrialEnd.DROPPED, failed_after_s=0.29, control_s=waited_s, mean_up_s=waited_s)
    assert POLICY.outcome(later) is Outcome.CONVICTED


def test_a_trial_its_worker_died_in_convicts_on_the_control_alone_without_a_canary_after() -> None:
    """Its successor closes the trial (`killed`), timed up to its own start: nobody asked the server a canary
    after, and none is needed, for the server did not fail; the worker did."""
    died = trial(TrialEnd.KILLED, failed_after_s=15.0, canary_after_s=None, control_s=300.0, mean_up_s=300.0)
    assert POLICY.outcome(died) is Outcome.CONVICTED
    too_young = msgspec.structs.replace(died, control_s=299.0)
    assert POLICY.outcome(too_young) is Outcome.VOID
    assert POLICY.outcome(msgspec.structs.replace(died, canary_before_s=60.0)) is Outcome.VOID
    letter = describe([suspicion(), suspicion(), died, died, died], POLICY)
    assert letter.startswith("no answer alone 3 times (its worker died in 3 of them)")
    assert letter.count("its worker died while it ran alone 15.0 s in") == 3
    assert "its successor working" in letter


def test_a_server_that_failed_often_shows_its_control_again_once_its_failures_are_a_window_old() -> None:
    """Once faults stop, any server shows the control within one window of its last failure, however often
    it failed before: the run's last suspects are tried on evidence the run's end has."""
    needed_s = 200.0
    window_s = control_window_s(needed_s)
    server = Steadiness(since=0.0)
    for second in range(1, 61):  # a failure a second for a minute
        server.failed(float(second), server_down=False)
    last = 60.0
    assert not server.shows(last + needed_s, needed_s, window_s)  # the stretch is there, the mean is not
    ready = server.ready_at(last, needed_s, window_s)
    assert ready is not None and ready <= last + window_s
    assert server.shows(ready, needed_s, window_s) and not server.shows(ready - 1.0, needed_s, window_s)
    # over its whole life, the same server would need 61 times the control: hours, not one window
    assert server.mean_up_s(last + window_s) < needed_s
    # a server seen down has to come back first
    server.failed(ready, server_down=True)
    assert server.ready_at(ready + 1.0, needed_s, window_s) is None


def test_a_server_s_record_keeps_its_recent_failures_and_forgets_the_work_before_those_it_drops() -> None:
    server = Steadiness(since=0.0)
    for second in range(1, RECORD_MAX_ENTRIES + 101):
        server.failed(float(second), server_down=False)
    assert len(server.failed_at) <= RECORD_MAX_ENTRIES and len(server.worked) <= RECORD_MAX_ENTRIES
    now = RECORD_MAX_ENTRIES + 101.0
    # what is known starts after the last failure forgotten: no work before it counts, every one since does
    kept = sum(1 for at in server.failed_at if at > server.known_since)
    assert server.mean_up_s(now) == pytest.approx((now - server.known_since) / (kept + 1))
    assert server.failures == RECORD_MAX_ENTRIES + 100


def test_a_request_out_of_its_timeout_while_the_server_answers_is_a_silence_timed_to_its_last_chunk() -> None:
    timed_out = InferenceUnavailable("Request timed out.", cause=FailureCause.TIMED_OUT)
    assert trial_end(timed_out, server_answers=True) is TrialEnd.SILENT
    assert failed_after_s(timed_out, TrialEnd.SILENT, started=100.0, last_sign=100.2, failed_at=160.2) == (
        pytest.approx(0.2)
    )
    # with the server gone too, it went down: timed to the failure, all the suspect may be blamed for
    assert trial_end(timed_out, server_answers=False) is TrialEnd.WENT_DOWN
    assert failed_after_s(timed_out, TrialEnd.WENT_DOWN, started=100.0, last_sign=100.2, failed_at=160.2) == (
        pytest.approx(60.2)
    )


def test_a_trial_out_of_its_timeout_on_a_server_the_watch_then_calls_hung_is_a_wedge_timed_by_the_watch() -> (
    None
):
    """With a client timeout shorter than the stall window, a wedge's request times out first and the
    server answers no canary: it went down, timed to the timeout. Once the liveness watch calls the server
    hung, the trial is the wedge it was, timed to when the server last made progress."""
    started, stalled_since = 100.0, 100.4
    hung = Outage(Liveness.HUNG.value, stalled_since=stalled_since)
    ending, took_s = retimed(TrialEnd.WENT_DOWN, 60.0, hung, started=started)
    assert ending is TrialEnd.WEDGED and took_s == pytest.approx(0.4)
    down = Outage(Liveness.DOWN.value, stalled_since=stalled_since)
    assert retimed(TrialEnd.WENT_DOWN, 60.0, down, started=started) == (TrialEnd.WENT_DOWN, 60.0)
    assert retimed(TrialEnd.WENT_DOWN, 60.0, None, started=started) == (TrialEnd.WENT_DOWN, 60.0)
    assert retimed(TrialEnd.SILENT, 0.2, hung, started=started) == (TrialEnd.SILENT, 0.2)
