"""The bound a run ends within once faults stop (docs/exactly-once.md, "Every run ends")."""

from __future__ import annotations

from workers.run_end import RunEnd
from workers.settings import WorkerSettings
from workers.state.poison import (
    CONTROL_WAIT_FACTOR,
    PoisonPolicy,
    TrialBegun,
    TrialEnd,
    timed_failure_s,
)

POLICY = PoisonPolicy()
ENDS = RunEnd(settings=WorkerSettings(), policy=POLICY, server_restart_s=60.0)


def dropped_after(failed_after_s: float) -> float:
    """How long the next trial of a suspect that dropped `failed_after_s` into its last may wait for its
    control, by the rule the tribunal applies."""
    begun = TrialBegun(
        trial="t", life="gpu0#a.0", started_at=0.0, canary_before_s=0.0, control_s=0.0, mean_up_s=0.0
    )
    ended = begun.end(TrialEnd.DROPPED, failed_after_s=failed_after_s, canary_after_s=0.0)
    return CONTROL_WAIT_FACTOR * POLICY.control_needed_s(timed_failure_s(ended, ENDS.timing_floor_s))


def test_a_trial_s_bound_covers_the_wait_for_the_control_of_a_failure_half_as_slow_again_as_the_last() -> (
    None
):
    # a drop 280 s into a trial: the next waits for the control of a failure 420 s in (found by the explorer,
    # seed 77: a trial timed 280 s in, the bound counting 280 s, the run 26,143 s against a bound of 8,340)
    wait_s = dropped_after(280.0)
    assert wait_s == CONTROL_WAIT_FACTOR * POLICY.control_factor * 420.0
    assert ENDS.trial_s(280.0) >= wait_s + ENDS.settings.liveness_stall_s + ENDS.server_restart_s


def test_a_first_trial_waits_no_longer_than_the_bound_for_a_failure_as_fast_as_a_wedge_can_be_timed() -> None:
    first_wait_s = CONTROL_WAIT_FACTOR * POLICY.control_needed_s(ENDS.timing_floor_s)
    assert ENDS.trial_s() == first_wait_s + ENDS.settings.liveness_stall_s + ENDS.server_restart_s


def test_each_poison_prompt_adds_its_suspicions_and_convictions_to_the_bound() -> None:
    clean_s = ENDS.bound_s()
    one_s = ENDS.bound_s(poison=1)
    suspicions, convictions = POLICY.suspicions_before_trial, POLICY.convictions_to_dead
    assert clean_s == ENDS.base_s
    assert one_s - clean_s == suspicions * (ENDS.suspicion_s + ENDS.trial_s()) + convictions * ENDS.trial_s()
    assert ENDS.bound_s(poison=1, killers=1) - one_s == (suspicions + convictions) * (
        ENDS.worker_restart_s + ENDS.trial_s()
    )
