"""How long an explored run may take to finish once its faults stop: docs/exactly-once.md's bound ("Every
run ends"), from the settings the fleet runs with and the schedule's own counts.

Once faults stop, a run is held open only by what waits on time: a message lost (found by the reconciler
after its grace), a lease whose holder died (taken back at once by the worker restarted on its GPU, or
run out), a retry's countdown (a batch that fails unexpectedly, five times), the uploader's age, and its
suspects. A suspect is held at most a trial's length per trial, one after the other on one GPU: its wait
for the control (at most CONTROL_WAIT_FACTOR times the control, over which window the server's earlier
failures leave its record), then the trial (a wedge: the liveness stall window and a restart; a hang: the
client's timeout), then the comeback. A poison prompt needs its suspicions first (a delivery each) and
then three convictions; an ordinary suspect completes its first trial once the faults are over.
"""

from __future__ import annotations

from collections.abc import Iterable

from tests.explorer.fleet import REQUEST_TIMEOUT_S, RESTART_S, TRIAL_SETTINGS, Fleet
from workers.generate.batches import MAX_BATCH_FAILURES, UNEXPECTED_ERROR_RETRY_S
from workers.record.upload_settings import UploadSettings
from workers.recovery.leases import DEFAULT_LEASE_TTL_S
from workers.recovery.reconciler import DEFAULT_RECONCILE_INTERVAL_S, DEFAULT_STRANDED_GRACE_S
from workers.settings import DEFAULT_SERVER_DOWN_RETRY_S
from workers.state.poison import (
    CONTROL_WAIT_FACTOR,
    DEFAULT_CONVICTIONS_TO_DEAD,
    DEFAULT_SUSPICIONS_BEFORE_TRIAL,
    PoisonPolicy,
)

CALM_TIME_STEP_S = 10.0  # time passes at least this much at once in the calm phase, when nothing can go on
CALM_LONGEST_STEP_S = DEFAULT_LEASE_TTL_S / 2  # and at most this: a turn of renewals keeps every lease

REDELIVERY_S = (
    DEFAULT_LEASE_TTL_S + DEFAULT_STRANDED_GRACE_S + DEFAULT_RECONCILE_INTERVAL_S + CALM_TIME_STEP_S
)
"""A batch back in a worker's hands: a lease run out, or a message lost and found by the reconciler."""
BASE_S = (
    REDELIVERY_S
    + MAX_BATCH_FAILURES * (UNEXPECTED_ERROR_RETRY_S + CALM_TIME_STEP_S)  # a batch that always raises
    + UploadSettings().max_age_s
    + DEFAULT_RECONCILE_INTERVAL_S
    + CALM_TIME_STEP_S
)
"""What any run may wait on once faults stop, suspects aside."""


def trial_bound_s(policy: PoisonPolicy) -> float:
    """The longest one trial holds its suspect's GPU, wait included, for the model's failures (each timed
    within the timing floor, or to its first chunk)."""
    needed_s = policy.control_needed_s(TRIAL_SETTINGS.timing_floor_s)
    longest_trial_s = max(TRIAL_SETTINGS.silence_limit_s + RESTART_S, REQUEST_TIMEOUT_S)
    return CONTROL_WAIT_FACTOR * needed_s + longest_trial_s + 2 * CALM_TIME_STEP_S


def run_bound_s(poison: int, ordinary_suspects: int, policy: PoisonPolicy) -> float:
    """A run finishes within this of its faults stopping, with `poison` prompts to convict and
    `ordinary_suspects` to acquit."""
    per_poison = DEFAULT_SUSPICIONS_BEFORE_TRIAL * (
        DEFAULT_SERVER_DOWN_RETRY_S + REDELIVERY_S
    ) + DEFAULT_CONVICTIONS_TO_DEAD * trial_bound_s(policy)
    return BASE_S + poison * per_poison + ordinary_suspects * trial_bound_s(policy)


def bound_for(fleet: Fleet, tried_alone: Iterable[str]) -> float:
    """The bound for the schedule: its planted poison, and the other prompts tried alone once calm."""
    poison = set(fleet.poison_kinds)
    return run_bound_s(len(poison), len(set(tried_alone) - poison), PoisonPolicy())
