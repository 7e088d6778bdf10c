"""The poison rule as a pure function of a prompt's record: suspicions never convict, a trial convicts only
with a canary before and after and a control as long as it needs, three convictions dead-letter, a trial
completed acquits; and the record read back from Redis is bounded, its bad lines no evidence."""

from __future__ import annotations

import math
import random

import pytest

from workers.generate.liveness import DEFAULT_LIVENESS_POLL_S
from workers.generate.trials import CONTROL_WAIT_FACTOR, Steadiness, TrialSettings
from workers.state.poison import (
    EVIDENCE_READ_MAX_BYTES,
    MIN_TIMING_S,
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
    assert POLICY.control_before_trial_s([trial(failed_after_s=30.0)], timing_floor_s=5.0) == 600.0


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
    per_trial = 1 - math.exp(-1 / POLICY.control_factor)
    for mean_between_outages_s in (60.0, 600.0, 3600.0, 86400.0):
        server = Steadiness(since=0.0)
        now, next_outage = 0.0, rng.expovariate(1 / mean_between_outages_s)
        convictions = trials = 0
        while trials < 5_000:
            now += rng.expovariate(1 / 30.0)  # a suspect arrives; it waits for the control it needs
            until = now + CONTROL_WAIT_FACTOR * needed_s
            while next_outage < now or (
                (short_s := server.short_of_s(now, needed_s)) > 0 and now < until and now + short_s <= until
            ):
                if next_outage < now:
                    server.failed(next_outage, server_down=True)
                    server.back(next_outage + restart_s)
                    now = max(now, next_outage + restart_s)
                    next_outage = now + rng.expovariate(1 / mean_between_outages_s)
                else:
                    now += 1.0
            trials += 1
            control_s, mean_up_s = server.control_s(now), server.mean_up_s(now)
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
