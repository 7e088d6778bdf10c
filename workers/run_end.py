"""Every run ends: the bound on how long a run may take to finish once faults stop, as a formula of the
workers' settings and of what holds a run at its end (docs/exactly-once.md, "Every run ends").

"Faults stop" means every server answers but for the poison planted in the run, no process dies but by a
prompt's doing, and Redis keeps its writes. A run is then held open only by what waits on time:
- a batch back in a worker's hands: its lease run out, or its message lost and found by the reconciler
  (`redelivery_s`);
- a batch that raises unexpectedly, MAX_BATCH_FAILURES times a retry apart, before its prompts are
  dead-lettered; the uploader's age before a part commits (`base_s`);
- its suspects of poison, one after the other on one GPU (the worst case). A poison prompt needs its
  suspicions in company first, each a failure and a hand-back (`suspicion_s`), then its convictions, each
  a trial (`trial_s`): the wait for the control its last failure needs, at most CONTROL_WAIT_FACTOR times
  it (over which window the server's earlier failures leave its record), then the trial, over within the
  liveness stall window, and the server's restart. A prompt that kills its
  worker process costs a worker's restart at each of its failures too, and restarts the wait of a
  suspect waiting on that worker. Each suspicion in company is a failure of its server, which may leave
  another suspect waiting there short of its control: tried at once, void (a trial more). An ordinary
  suspect is acquitted by its first trial.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.generate.batches import MAX_BATCH_FAILURES, UNEXPECTED_ERROR_RETRY_S
from workers.generate.trials import WEDGE_TIMING_POLLS
from workers.recovery.seat import HOLDER_GONE_AFTER_S
from workers.settings import WorkerSettings
from workers.state.poison import CONTROL_WAIT_FACTOR, NEXT_FAILURE_HEADROOM, PoisonPolicy

SYSTEMD_RESTART_S = 5.0  # RestartSec of deploy/systemd/draftgen-generate@.service
WORKER_START_S = 30.0  # a generate worker's start: Python, Celery, its engine, before it takes its seat


@dataclass(frozen=True)
class RunEnd:
    settings: WorkerSettings = field(default_factory=WorkerSettings)
    policy: PoisonPolicy = field(default_factory=PoisonPolicy)
    server_restart_s: float = 0.0  # a server restarted after a wedge or a crash answers again this late
    worker_restart_s: float = SYSTEMD_RESTART_S + WORKER_START_S + HOLDER_GONE_AFTER_S

    @property
    def redelivery_s(self) -> float:
        s = self.settings
        return s.lease_ttl_s + s.stranded_grace_s + s.reconcile_interval_s

    @property
    def base_s(self) -> float:
        """What any run may wait on once faults stop, its suspects aside."""
        s = self.settings
        return (
            self.redelivery_s
            + MAX_BATCH_FAILURES * UNEXPECTED_ERROR_RETRY_S
            + s.upload.max_age_s
            + s.reconcile_interval_s
        )

    @property
    def timing_floor_s(self) -> float:
        """A wedge is timed to within two liveness polls: a first trial waits for the control of that."""
        return WEDGE_TIMING_POLLS * self.settings.liveness_poll_s

    def trial_s(self, failure_s: float = 0.0) -> float:
        """The longest one trial holds its GPU, its wait included, for a suspect that fails up to `failure_s`
        in (a failure timed no finer than the timing floor): the wait for its control (that of a failure
        NEXT_FAILURE_HEADROOM times as slow as its last), then the trial, which ends within the liveness
        stall window (a silence is cut then; a wedge is called then, whatever the client's timeout) and the
        server's restart after a wedge."""
        needed_s = self.policy.control_needed_s(max(self.timing_floor_s, failure_s * NEXT_FAILURE_HEADROOM))
        return CONTROL_WAIT_FACTOR * needed_s + self.settings.liveness_stall_s + self.server_restart_s

    @property
    def suspicion_s(self) -> float:
        """How long one suspicion in company takes at most: the request's failure (a silence, or a wedge
        and the server's restart), then its batch handed back."""
        s = self.settings
        failed_s = max(s.silence_limit_s, s.liveness_stall_s + self.server_restart_s)
        return failed_s + s.server_down_retry_s

    def bound_s(
        self, *, poison: int = 0, killers: int = 0, ordinary_suspects: int = 0, failure_s: float = 0.0
    ) -> float:
        """A run finishes within this once faults stop, with `poison` prompts to convict that fail
        `failure_s` into a trial (`killers` of them kill their worker) and `ordinary_suspects` to acquit."""
        suspicions, convictions = self.policy.suspicions_before_trial, self.policy.convictions_to_dead
        # each suspicion in company is a failure of the server: a suspect waiting on it may find its control
        # out of reach and be tried at once, void (one trial more each, at most)
        per_poison = suspicions * (self.suspicion_s + self.trial_s(failure_s)) + convictions * self.trial_s(
            failure_s
        )
        per_killer = (suspicions + convictions) * (self.worker_restart_s + self.trial_s(failure_s))
        return self.base_s + poison * per_poison + killers * per_killer + ordinary_suspects * self.trial_s()
