"""How long an explored run may take to finish once its faults stop: docs/exactly-once.md's bound ("Every
run ends", `workers.run_end.RunEnd`) for the settings the modelled fleet runs with (the README's, but for
a client timeout shorter than the liveness stall window) and the schedule's own counts, plus the model's
granularity: time passes in steps of CALM_TIME_STEP_S to CALM_LONGEST_STEP_S, so each wait may end up to
one step late.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tests.explorer.fleet import DROPS_LATE_AFTER_S, REQUEST_TIMEOUT_S, RESTART_S, Fleet, PoisonKind
from workers.recovery.leases import DEFAULT_LEASE_TTL_S
from workers.recovery.seat import HOLDER_GONE_AFTER_S
from workers.run_end import RunEnd
from workers.settings import WorkerSettings
from workers.state.poison import (
    DEFAULT_CONVICTIONS_TO_DEAD,
    DEFAULT_SUSPICIONS_BEFORE_TRIAL,
    Evidence,
    PoisonPolicy,
    failed_trials,
)

CALM_TIME_STEP_S = 10.0  # time passes at least this much at once in the calm phase, when nothing can go on
CALM_LONGEST_STEP_S = DEFAULT_LEASE_TTL_S / 2  # and at most this: a turn of renewals keeps every lease
WAITS_OF_A_RUN = 8  # the timers any run may wait on: a lease, a grace, reconcile passes, retries, an upload
WAITS_OF_A_TRIAL = 4  # its control, the client's timeout, the liveness stall window, the server's restart
WAITS_OF_A_SUSPICION = 2  # the failure, then the hand-back's countdown
MODELLED = RunEnd(
    settings=WorkerSettings(request_timeout_s=REQUEST_TIMEOUT_S),
    policy=PoisonPolicy(),
    server_restart_s=RESTART_S,
    worker_restart_s=HOLDER_GONE_AFTER_S,  # the model restarts a dead worker at once
)


def longest_failure_s(fleet: Fleet, evidence: Mapping[str, Sequence[Evidence]]) -> float:
    """How far into a trial the planted poison has failed at the latest, by its records (`evidence`):
    the bound's f. A drop is planted DROPS_LATE_AFTER_S in, but timed as the engine times it, when its
    error arrives: during the faults time may pass in a leap meanwhile, as a loaded host's may; and a
    worker a prompt killed is timed up to its successor's start."""
    planted = DROPS_LATE_AFTER_S if PoisonKind.DROPS_LATE in fleet.poison_kinds.values() else 0.0
    timed = (
        e.failed_after_s
        for prompt_id in fleet.poison_kinds
        for e in failed_trials(evidence.get(prompt_id, ()))
    )
    return max(planted, max(timed, default=0.0))


def bound_for(fleet: Fleet, tried_alone: Iterable[str], failure_s: float) -> float:
    """The bound for the schedule: its planted poison, which has failed up to `failure_s` into a trial
    (`longest_failure_s`), and the other prompts tried alone once calm."""
    poison = set(fleet.poison_kinds)
    killers = sum(1 for kind in fleet.poison_kinds.values() if kind is PoisonKind.KILLS)
    ordinary = len(set(tried_alone) - poison)
    trials = len(poison) * (DEFAULT_SUSPICIONS_BEFORE_TRIAL + DEFAULT_CONVICTIONS_TO_DEAD) + ordinary
    suspicions = len(poison) * DEFAULT_SUSPICIONS_BEFORE_TRIAL
    steps = WAITS_OF_A_RUN + WAITS_OF_A_TRIAL * trials + WAITS_OF_A_SUSPICION * suspicions
    bound_s = MODELLED.bound_s(
        poison=len(poison), killers=killers, ordinary_suspects=ordinary, failure_s=failure_s
    )
    return bound_s + steps * CALM_LONGEST_STEP_S
