"""One explored schedule: a fleet, a seed, a fault phase, then a calm phase until the run is finished.

Each action is one of: let a parked step make its Redis call; start a step (a delivery, a retry whose
countdown is over, a batch tail, a lease renewal, a reconcile pass, a flush, a second enqueue; an
enqueue drawn to run in 2 or 3 parts starts them once it has opened, and releases its lease after); let
time pass; or, in the fault phase, a fault: SIGKILL a process between two of its Redis calls, restart
a dead one, duplicate or lose a queued message, let the visibility timeout restore every unacked
message, or roll Redis back to its state some actions ago (its last writes lost: a power cut with
`appendfsync everysec`, a failover to a replica that lagged). The invariants
(tests/explorer/invariants.py) are checked after every action. Faults go on a while past the run's
first finish, so that rollbacks undo commits too. Then the calm phase restarts the dead, re-runs
enqueue if Redis lost prompts an enqueue had claimed (what an operator does after Redis lost writes),
and works on without faults until the run is finished: a run that never finishes is a failure too (a
prompt stranded, dead letters never flushed).
"""

from __future__ import annotations

import random
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tests.explorer.fleet import (
    RUN,
    SEAT_CHECK,
    SLEEP,
    EnqueuePart,
    EnqueueProcess,
    Fleet,
    FleetShape,
    PoisonKind,
    Snapshot,
    Twin,
    UploaderProcess,
    Worker,
)
from tests.explorer.invariants import Invariants
from tests.explorer.liveness import CALM_LONGEST_STEP_S, CALM_TIME_STEP_S, bound_for, longest_failure_s
from tests.explorer.schedule import Killed, Process, Scheduler, Step
from workers.broker.kombu_layout import waiting_messages
from workers.record.reading import read_enqueued_ids
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE

FAULT_PHASE_MAX_ACTIONS = 800
FAULTS_AFTER_FINISHING = 40  # faults go on past the run's first finish: rollbacks then undo commits
CALM_PHASE_ACTIONS = 40_000  # a net under the time bound (tests/explorer/liveness.py): a loop without time
RECENT_SNAPSHOT_ACTIONS = 60  # the writes a rollback may lose: a power cut ~1 s, a lagging replica more
TIME_STEPS_S = (10.0, 30.0, 60.0)  # multiples of ten, as every threshold is: ages compare the same way
PROMPT_COUNTS = (4, 6, 8)
BATCH_SIZES = (2, 3)
WORKERS = 2
POISONED_SHARE = 0.25  # schedules where one batch's prompts make every attempt raise
POISON_SHARE = 0.6  # of the others, schedules with prompts poison to prove, drawn from POISON_PLANTINGS
# (how many, all of the run's single prompts when None; the last ones, or drawn among all)
POISON_PLANTINGS = ((1, False), (1, True), (3, True), (None, False))
UUID_SEED_SALT = 0x1D5
STEPS_A_WORKER_RUNS_AT_ONCE = 2  # deliveries in flight per worker
CALM_PROGRESS = frozenset({"takes a message", "runs a retry", "settles a tail"})  # a worker's, beside time
CALM_PERIODIC = frozenset({"renews", "reconciles"})
PART_STEP = "enqueue part"

# The weights of the choices, relative to one another.
GRANT = 12.0
START = 3.0
RARE = 0.4
TIME = 0.5
FAULT = 0.4

Owner = Worker | UploaderProcess | EnqueueProcess | EnqueuePart | Twin
Option = tuple[float, str, Callable[[], object]]


@dataclass
class ScheduleResult:
    seed: int
    violations: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    actions: int = 0
    checks: int = 0
    enqueues_in_parts: int = 0  # enqueues that opened and started their parts
    finished: bool = False
    log: list[str] = field(default_factory=list)

    def describe(self, trace: list[str]) -> str:
        lines = [f"schedule {self.seed}: {len(self.violations)} violations after {self.actions} actions"]
        lines += [f"  - {v}" for v in self.violations[:10]]
        lines += ["last actions:", *(f"  {a}" for a in self.log[-25:])]
        lines += ["last Redis calls:", *(f"  {c}" for c in trace[-25:])]
        return "\n".join(lines)


class Explorer:
    def __init__(self, seed: int, redis_url: str, output: Path) -> None:
        self.rng = random.Random(seed)
        prompts = self.rng.choice(PROMPT_COUNTS)
        poisoned = self.rng.random() < POISONED_SHARE
        planted, at_the_tail = (0, False)
        if not poisoned and self.rng.random() < POISON_SHARE:  # a batch that fails takes them with it
            count, at_the_tail = self.rng.choice(POISON_PLANTINGS)
            planted = prompts if count is None else count
        shape = FleetShape(
            prompts=prompts,
            batch_size=self.rng.choice(BATCH_SIZES),
            workers=WORKERS,
            poisoned=poisoned,
            poison=tuple(self.rng.choice(list(PoisonKind)) for _ in range(planted)),
            at_the_tail=at_the_tail,
        )
        self.scheduler = Scheduler()
        self.fleet = Fleet(redis_url, output, self.rng, self.scheduler, shape)
        self.checks = Invariants(self.fleet)
        self.result = ScheduleResult(seed)
        self._input_held = False  # once calm: Redis holds every prompt of the input
        self._failure_s = 0.0  # the longest its poison has failed into a trial, by its records so far

    # ------------------------------------------------------------------ the two phases

    def run(self) -> ScheduleResult:
        for worker in self.fleet.workers:
            self._start(worker, "seat", worker.take_seat)
        self._new_enqueue()
        faults_end = FAULT_PHASE_MAX_ACTIONS
        for action in range(FAULT_PHASE_MAX_ACTIONS):
            if action >= faults_end:
                break
            if not self._act(faults=True):
                return self._end()
            if faults_end == FAULT_PHASE_MAX_ACTIONS and self.checks.finished():
                faults_end = action + FAULTS_AFTER_FINISHING
        self._calm_down()
        if not self._calm_phase():
            return self._end()
        self.result.violations += self.checks.at_end()
        return self._end()

    def _calm_down(self) -> None:
        """Faults over: the operator has loaded the functions, systemd has restarted the dead, a second
        worker on a live GPU has given up, and every hung server generates again."""
        for twin in self.fleet.twins:
            if not twin.process.dead:
                self._kill(twin.process)
        self._restart_the_dead()
        if not self.fleet.library_loaded():
            self.fleet.load_the_library()
        for label in list(self.fleet.hung_servers):
            self.fleet.server_back(label)
        self.fleet.flaky_servers.clear()
        self.fleet.calm = True

    def _restart_the_dead(self) -> None:
        """systemd's Restart=always: every dead generate worker and uploader starts again."""
        for name in [w.process.name for w in self.fleet.workers] + [self.fleet.uploader.process.name]:
            if (worker := self.fleet.restart(name)) is not None:
                self._start(worker, "seat", worker.take_seat)

    def _calm_phase(self) -> bool:
        """Work on without faults, every process given its turn (fairly: time passes only when nothing else
        can go on), until the run is finished: within its bound of time (tests/explorer/liveness.py), or
        the schedule is a violation (a run held open, as surely as a prompt lost). False once violated."""
        started_s = self.fleet.clock.now_s
        ticked = False  # the periodic steps have had their turn since time last passed
        woken: set[int] = set()  # sleeping steps whose time has passed
        for _ in range(CALM_PHASE_ACTIONS):
            if not self.scheduler.parked() and self.checks.finished():
                self.result.finished = True
                return self._within_bound(started_s)
            self._enqueue_again_if_redis_lost_prompts()
            options = self._calm_options(woken)
            if not options and not ticked:  # each periodic thread turns once between two moments
                options, ticked = [self._all_of(self._periodic_options())], True
            if options:
                if not self._act_on(options, faults=False):
                    return False
                continue
            if not self._within_bound(started_s):
                return False
            self.fleet.pass_time(self._calm_time_step_s())
            woken = {id(step) for step in self.scheduler.parked() if step.parked_at == SLEEP}
            ticked = False
        self.result.violations.append(f"the run never finished once faults stopped: {self._counts()}")
        return False

    def _calm_time_step_s(self) -> float:
        """Time passes to the first sleeper's wake, by CALM_TIME_STEP_S at least and CALM_LONGEST_STEP_S at
        most (the periodic steps then had their turn: every lease renewed, the reconciler's pass)."""
        wakes = [self.fleet.next_wake_s(self.scheduler.parked()), *self._due_s()]
        wake_s = min((wake for wake in wakes if wake is not None), default=None)
        wait_s = CALM_LONGEST_STEP_S if wake_s is None else wake_s - self.fleet.clock.now_s
        return min(max(wait_s, CALM_TIME_STEP_S), CALM_LONGEST_STEP_S)

    def _due_s(self) -> list[float]:
        """When a flush waiting its countdown, and the messages workers hold for later, are due."""
        fleet, now_s = self.fleet, self.fleet.clock.now_s
        due = [fleet.flush_due_at_s] if fleet.flush_requests and fleet.flush_due_at_s > now_s else []
        return due + [held.eta_s for worker in fleet.workers for held in worker.held if held.eta_s > now_s]

    def _within_bound(self, started_s: float) -> bool:
        took_s = self.fleet.clock.now_s - started_s
        bound_s = bound_for(self.fleet, self.fleet.tried_when_calm, self._poison_failure_s())
        if took_s <= bound_s:
            return True
        poison, tried = len(self.fleet.poison_kinds), len(self.fleet.tried_when_calm)
        self.result.violations.append(
            f"the run was not finished {took_s:,.0f} s after faults stopped, past its bound of "
            f"{bound_s:,.0f} s ({poison} poison prompts, {tried} tried alone): {self._counts()}"
        )
        return False

    def _poison_failure_s(self) -> float:
        """The longest the planted poison has failed into a trial, by its records as read so far (a record
        keeps its newest EVIDENCE_MAX_BYTES: an early failure may fall out of it, not out of the bound)."""
        if self.fleet.poison_kinds:
            records = RunLedger(self.fleet.admin, RUN).strikes_of(list(self.fleet.poison_kinds))
            self._failure_s = max(self._failure_s, longest_failure_s(self.fleet, records))
        return self._failure_s

    def _calm_options(self, woken: set[int]) -> list[Option]:
        """What can go on now without time passing: a parked call, a sleeper whose time came, a message
        to take, a retry due, a tail, a flush, a restart of the dead."""
        fleet = self.fleet
        options: list[Option] = []
        for step in self.scheduler.parked():
            if step.parked_at != SLEEP or id(step) in woken:
                options.append(
                    (GRANT, f"grant {step.process.name}/{step.what}", partial(self._wake, step, woken))
                )
        if any(w.process.dead for w in fleet.workers) or fleet.uploader.process.dead:
            options.append((START, "systemd restarts the dead", self._restart_the_dead))
        queued = self._queued()
        for worker in fleet.workers:
            if not worker.process.dead and worker.seated:
                calm = self._worker_options(worker, queued)
                options += [o for o in calm if o[1].split(" ", 1)[1] in CALM_PROGRESS]
        uploader = fleet.uploader
        if (
            not uploader.process.dead
            and fleet.flush_requests
            and fleet.clock.now_s >= fleet.flush_due_at_s  # a flush whose lock was busy waits its countdown
            and not self._running(uploader.process, "flush")
        ):
            options.append((START, "flush", partial(self._start, uploader, "flush", uploader.flush)))
        return options

    def _periodic_options(self) -> list[Option]:
        """Each live worker's periodic turns (renewing its leases, a reconcile pass), as their threads run
        between two moments of time (its seat keeper turns as time passes: `Fleet.pass_time`)."""
        options: list[Option] = []
        for worker in self.fleet.workers:
            if not worker.process.dead and worker.seated:
                options += [o for o in self._worker_options(worker) if o[1].split(" ", 1)[1] in CALM_PERIODIC]
        return options

    @staticmethod
    def _all_of(options: list[Option]) -> Option:
        """One action doing each of `options` (steps started together)."""

        def each() -> None:
            for _weight, _label, action in options:
                action()

        return (START, "the periodic threads turn: " + ", ".join(label for _w, label, _a in options), each)

    def _wake(self, step: Step, woken: set[int]) -> None:
        """Grant a step its call; a sleeper's time has come once: it sleeps again until time passes."""
        woken.discard(id(step))
        self.scheduler.grant(step)

    def _end(self) -> ScheduleResult:
        self.result.checks = self.checks.checked
        for step in self.scheduler.parked():
            self.scheduler.kill(step.process)
        return self.result

    def _act(self, *, faults: bool) -> bool:
        return self._act_on(self._options(faults=faults), faults=faults)

    def _act_on(self, options: list[Option], *, faults: bool) -> bool:
        _weight, label, action = self.rng.choices(options, weights=[o[0] for o in options])[0]
        self.fleet.action += 1
        self.result.actions += 1
        if faults:
            self.fleet.take_snapshot(keep=RECENT_SNAPSHOT_ACTIONS)
        self.result.log.append(label)
        action()
        self._carry_out_prompt_kills()
        self._advance_enqueues_in_parts()
        self._collect_step_errors()
        self.result.violations += self.checks.after_step()
        return not self.result.violations

    def _carry_out_prompt_kills(self) -> None:
        """A worker a poison prompt killed dies whole: whatever else of it runs is killed too."""
        while self.fleet.prompt_kills:
            process = self.fleet.prompt_kills.pop()
            self.result.faults["killed by a prompt"] += 1
            self.scheduler.kill(process)
            self.fleet.close_sockets(process)

    # ------------------------------------------------------------------ choosing

    def _options(self, *, faults: bool) -> list[Option]:
        fleet = self.fleet
        grant = self.scheduler.grant
        options: list[Option] = [
            (TIME if s.parked_at == SLEEP else GRANT, f"grant {s.process.name}/{s.what}", partial(grant, s))
            for s in self.scheduler.parked()
        ]
        queued = self._queued()
        for worker in fleet.workers:
            if not worker.process.dead and worker.seated:
                options += self._worker_options(worker, queued)
        uploader = fleet.uploader
        if (
            not uploader.process.dead
            and fleet.flush_requests
            and not self._running(uploader.process, "flush")
        ):
            options.append((START, "flush", partial(self._start, uploader, "flush", uploader.flush)))
        if faults and len(fleet.enqueues) < 2:
            # most telling while the first is at work: the two then race for the run's lock
            racing = any(self._at_work(e) for e in fleet.enqueues)
            options.append((START if racing else RARE, "a second enqueue", self._new_enqueue))
        for seconds in TIME_STEPS_S:
            weight = TIME if faults else TIME / 3
            options.append((weight, f"{seconds:.0f} s pass", partial(fleet.pass_time, seconds)))
        if faults:
            options += self._fault_options()
        return options

    def _worker_options(self, worker: Worker, queued: int | None = None) -> list[Option]:
        name = worker.process.name
        queued = self._queued() if queued is None else queued
        options: list[Option] = []

        def step(weight: float, label: str, what: str, body: Callable[[], None]) -> None:
            options.append((weight, f"{name} {label}", partial(self._start, worker, what, body)))

        consuming = name not in self.fleet.hung_servers  # a suspended worker's consumer is cancelled
        if consuming and queued and self._running(worker.process, "deliver") < STEPS_A_WORKER_RUNS_AT_ONCE:
            step(START, "takes a message", "deliver", worker.deliver)
        if any(d.eta_s <= self.fleet.clock.now_s for d in worker.held) and not self._running(
            worker.process, "due"
        ):
            step(START, "runs a retry", "due", worker.run_due)
        if len(worker.tails) > self._running(worker.process, "tail"):
            step(START, "settles a tail", "tail", worker.settle_tail)
        if not self._running(worker.process, "renew"):
            step(START / 2, "renews", "renew", worker.renew)
        if not self._running(worker.process, SEAT_CHECK):
            step(START / 6, "checks its seat", SEAT_CHECK, worker.check_seat)
        if not any(self._running(w.process, "reconcile") for w in self.fleet.workers):  # one at a time
            step(START / 12, "reconciles", "reconcile", worker.reconcile)
        return options

    def _fault_options(self) -> list[Option]:
        fleet = self.fleet
        options: list[Option] = []
        for process in [
            *(w.process for w in fleet.workers),
            fleet.uploader.process,
            *(e.process for e in fleet.enqueues),
            *(part.process for e in fleet.enqueues for part in e.started_parts),
        ]:
            if not process.dead:
                options.append((FAULT / 4, f"kill {process.name}", partial(self._kill, process)))
            elif not process.name.startswith("enqueue"):
                options.append((FAULT, f"restart {process.name}", partial(self._restart, process.name)))
        options += [
            (FAULT / 2, "duplicate a message", partial(self._fault, "duplicated", fleet.duplicate_a_message)),
            (FAULT / 2, "lose a message", partial(self._fault, "lost", fleet.lose_a_message)),
            (FAULT / 4, "visibility timeout", partial(self._fault, "restored", fleet.restore_unacked)),
            (FAULT / 3, "a malformed message", partial(self._fault, "malformed", fleet.push_malformed)),
            (FAULT / 3, "a forged staged record", partial(self._fault, "forged", fleet.forge_a_record)),
            (
                FAULT / 4,
                "a message delayed for years",
                partial(self._fault, "delayed", fleet.delay_a_message_for_years),
            ),
        ]
        return options + self._redis_and_seat_faults()

    def _redis_and_seat_faults(self) -> list[Option]:
        fleet = self.fleet
        unsubscribe = partial(self._fault, "unsubscribed", fleet.unsubscribe)
        options: list[Option] = [(FAULT / 2, "Redis drops every subscription", unsubscribe)]
        for label in [worker.process.name for worker in fleet.workers]:
            if label in fleet.hung_servers:
                back = partial(self._fault, "servers back", partial(fleet.server_back, label))
                options.append((FAULT, f"{label}'s server generates again", back))
            else:
                hang = partial(self._fault, "servers hung", partial(fleet.hang_server, label))
                options.append((FAULT / 4, f"{label}'s server hangs: its worker is suspended", hang))
        if not fleet.flaky_servers:
            flaky = partial(self._fault, "flaky nodes", fleet.turn_flaky)
            options.append((FAULT / 6, "the node's servers fail every few seconds from now on", flaky))
        if fleet.library_loaded():
            lose = partial(self._fault, "library lost", fleet.lose_the_library)
            options.append((FAULT / 3, "the function library is lost", lose))
        else:
            options.append((FAULT, "the producer loads the functions", fleet.load_the_library))
        if not any(not twin.process.dead and self._running(twin.process, "seat") for twin in fleet.twins):
            label = self.rng.choice([worker.process.name for worker in fleet.workers])
            options.append((FAULT / 3, f"a second worker starts on {label}", partial(self._new_twin, label)))
        if fleet.snapshots:
            options.append((FAULT, "Redis loses its last writes", self._roll_back))
        return options

    def _queued(self) -> int:
        """Messages waiting (a real worker blocks on an empty queue: polling it is no event)."""
        return waiting_messages(self.fleet.admin, GENERATE_QUEUE)

    def _running(self, process: Process, what: str) -> int:
        return sum(1 for s in self.scheduler.steps if s.process is process and s.what == what and not s.ended)

    # ------------------------------------------------------------------ doing

    def _start(self, owner: Owner, what: str, body: Callable[[], object]) -> None:
        self.scheduler.start(owner.process, what, body)

    def _new_enqueue(self) -> None:
        process = self.fleet.new_enqueue()
        self._start(process, "enqueue", process.enqueue)

    def _advance_enqueues_in_parts(self) -> None:
        """An enqueue in parts starts them once it has opened, and gives its lease up once they all ended
        (killed or done), as producer/enqueue/processes.py does; a killed one does neither."""
        for enqueue in self.fleet.enqueues:
            if enqueue.process.dead or enqueue.opened is None or enqueue.released:
                continue
            if not enqueue.started_parts:
                self.result.enqueues_in_parts += 1
                for part in enqueue.start_parts():
                    self._start(part, PART_STEP, part.enqueue)
            elif not any(self._running(part.process, PART_STEP) for part in enqueue.started_parts):
                self._start(enqueue, "release", enqueue.release)

    def _at_work(self, enqueue: EnqueueProcess) -> bool:
        """Whether an enqueue, or a part of it, may still claim or release (a killed one's lease runs out)."""
        if any(self._running(part.process, PART_STEP) for part in enqueue.started_parts):
            return True
        if enqueue.process.dead:
            return False
        opened_not_released = enqueue.opened is not None and not enqueue.released
        return opened_not_released or bool(self._running(enqueue.process, "enqueue"))

    def _enqueue_again_if_redis_lost_prompts(self) -> None:
        """Once faults are over and no enqueue is at work: if Redis lacks prompts of the input, re-run it.
        Looked at once after each enqueue (no fault can make Redis lose them again)."""
        fleet = self.fleet
        if self._input_held or any(self._at_work(e) for e in fleet.enqueues):
            return
        held = RunLedger(fleet.admin, RUN).enqueued_ids()
        if {p.id for p in fleet.prompts} <= held and read_enqueued_ids(fleet.store) <= held:
            self._input_held = True
            return
        self.result.log.append("enqueue again: Redis lacks prompts of the input")
        self._new_enqueue()

    def _kill(self, process: Process) -> None:
        self.result.faults["killed"] += 1
        self.scheduler.kill(process)
        self.fleet.close_sockets(process)

    def _restart(self, name: str) -> None:
        self.result.faults["restarted"] += 1
        worker = self.fleet.restart(name)
        if worker is not None:
            self._start(worker, "seat", worker.take_seat)

    def _new_twin(self, label: str) -> None:
        self.result.faults["twins"] += 1
        twin = self.fleet.new_twin(label)
        self._start(twin, "seat", twin.take_seat)

    def _roll_back(self) -> None:
        snapshot: Snapshot = self.rng.choice(self.fleet.snapshots)
        self.result.faults["rolled back"] += 1
        keys = RunKeys(RUN)
        parts_before = int(self.fleet.admin.get(keys.next_part) or 0)
        self.fleet.roll_back(snapshot)
        if int(self.fleet.admin.get(keys.next_part) or 0) < parts_before:
            self.result.faults["commits lost"] += 1

    def _fault(self, name: str, fault: Callable[[], object]) -> None:
        if fault():
            self.result.faults[name] += 1

    def _collect_step_errors(self) -> None:
        for step in self.scheduler.prune():
            if step.error is not None and not isinstance(step.error, Killed):
                text = "".join(traceback.format_exception(step.error)).strip().splitlines()
                self.result.violations.append(
                    f"{step.process.name}/{step.what} raised {step.error!r}: " + " | ".join(text[-6:])
                )

    def _counts(self) -> str:
        admin, keys = self.fleet.admin, RunKeys(RUN)
        return (
            f"{RunLedger(admin, RUN).counts()}, open batches {admin.zcard(keys.open_batches)}, "
            f"leases {admin.zcard(keys.leases)}, queued {waiting_messages(admin, GENERATE_QUEUE)}, "
            f"flush requests {len(self.fleet.flush_requests)}"
        )


def explore(seed: int, redis_url: str, output: Path) -> tuple[ScheduleResult, list[str]]:
    """Run one schedule. Ids the code draws from uuid4 (batches, lease owners, lock tokens) come from
    the seed too: Redis orders equal scores by member, so a replay must draw the same ones."""
    ids = random.Random(seed ^ UUID_SEED_SALT)
    real_uuid4 = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
    try:
        explorer = Explorer(seed, redis_url, output)
        try:
            return explorer.run(), explorer.scheduler.trace
        finally:
            explorer.scheduler.close_clients()
            explorer.fleet.admin.close()
    finally:
        uuid.uuid4 = real_uuid4
