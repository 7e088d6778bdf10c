"""The modelled fleet: processes running draftgen's real protocol code against a real redis-server.

Real: every Lua script; the enqueue (`Enqueuer.enqueue`, or in parts: `Enqueuer.enqueue_part` of each
part's share, dealt as producer/enqueue/processes.py deals it); a generate message's whole handling
(`workers.generate.batches.handle_generate`, and batch tails settled by `_settle_tail`); lease renewal
(`LeaseKeeper.renew`); reconcile passes (`Reconciler.reconcile_all`); flushes and adoptions
(`Uploader.flush`); the object store (a folder); kombu's Redis layout of the generate queue (the list
and the `unacked` hash), which the reconciler reads.

Modelled: the SGLang server (each request is answered, refused with a 400, or gets no answer, as the
schedule's generator draws; every CONVERSATION_EVERY-th prompt is a conversation of 2 or 3 turns,
generated turn by turn as the engine does: its finished turns kept with the run (`keep_turns`), a
later delivery resuming after them (`kept_turns`), staged whole after its last; the prompts of one
poison batch make it raise unexpectedly, every time);
Celery's delivery (a worker pops a message and records it unacked, a task's return acks it, RetryLater
publishes the retry with its countdown and then acks); time (a fake monotonic clock for the lease
keepers, and Redis's clock-scored sets and key expiries shifted back when time passes); the upload
queue (a list of flush requests). The faults are the schedule's: see tests/explorer/explorer.py.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import enum
import functools
import json
import math
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import msgspec
import redis

from core.records import DeadLetter, DeadLetterReason, Message, Origin, Prompt, SamplingSettings, Turn
from core.run_settings.model import RunSettings
from inference.errors import FailureCause, InferenceUnavailable
from inference.metrics_reader import MetricsSnapshot
from intake.rejected import RejectedRow
from producer.enqueue.enqueuer import Enqueuer, EnqueueSession, pin_settings
from producer.enqueue.processes import dealt
from producer.errors import EnqueueBusy
from tests.explorer.schedule import GatedRedis, Killed, Process, Scheduler, Step, current_step
from tests.support.malformed_messages import (
    NO_CHAIN,
    changed,
    encoded,
    envelope_of,
    generate_item,
    replaced,
    with_body,
    with_call,
    without_property,
)
from tests.support.records import completion, prompt
from tests.support.redis_snapshot import RedisSnapshot
from workers.bootsteps.seating import take_back_after_death
from workers.broker.message_check import why_malformed
from workers.broker.parked_messages import park, parked_message
from workers.context import WorkerContext
from workers.errors import FunctionsMissing, RetryLater, RunBroken, SeatHeld
from workers.generate.batch_life import BatchLife
from workers.generate.batches import handle_generate
from workers.generate.generation import BatchJob, BatchOutcome, Handover
from workers.generate.liveness import DEFAULT_LIVENESS_POLL_S, Liveness, LivenessJudge, Outage
from workers.generate.trials import (
    Steadiness,
    TrialSettings,
    answers_awaited,
    control_wait_s,
    control_window_s,
    failed_after_s,
    retimed,
    trial_end,
)
from workers.record.manifest import MANIFEST_PREFIX
from workers.record.output_pin import write_run_json
from workers.record.storage import FolderStore
from workers.record.upload_settings import UploadSettings
from workers.record.uploader import Uploader
from workers.recovery.leases import Acquired, Lease, LeaseKeeper
from workers.recovery.reconciler import RECONCILER_LOCK_KEY, Reconciler, ReconcileSettings
from workers.recovery.seat import Seat, TakenSeat
from workers.recovery.seat_stamp import MICROSECONDS_PER_S, ServerView, decode_stamp, encode_stamp
from workers.settings import WorkerSettings
from workers.state.batch_priority import batch_priority
from workers.state.codec import encode_blob
from workers.state.keys import SEATS_KEY_PREFIX, RunKeys
from workers.state.ledger import server_identity
from workers.state.poison import (
    CONTROL_WAIT_FACTOR,
    Evidence,
    PoisonPolicy,
    Suspicion,
    TrialBegun,
    TrialEnd,
    TrialEnded,
    Verdict,
    describe,
)
from workers.state.protocol import LIBRARY
from workers.state.queues import (
    GENERATE_QUEUE,
    GENERATE_TASK,
    KOMBU_PRIORITY_STEPS,
    KOMBU_UNACKED_INDEX_KEY,
    KOMBU_UNACKED_KEY,
    RESUMED_BATCH_PRIORITY,
    queue_lists,
)

RUN = "explored"
ANSWERED, REFUSED, UNANSWERED, POISON = "answered", "refused", "unanswered", "dead-lettered as poison"
POISON_POLICY = PoisonPolicy()  # the defaults, as workers run them
TRIAL_SETTINGS = TrialSettings()  # the defaults: the liveness watch's 300 s stall window and 5 s polls
# The modelled server's timings, in seconds of the schedule's clock. Its workers' client timeout is shorter
# than the liveness stall window, as an operator may set it: a hanging request (its server answers others)
# runs out of it, its first chunk come at once; a wedged server's request too, and the liveness watch
# calls the server hung after its stall window, timed to its last poll that saw progress, and restarts it,
# answering again a while later.
WEDGE_TIMED_S = 2.0
REQUEST_TIMEOUT_S = 60.0
FIRST_CHUNK_S = 0.2
RESTART_S = 30.0
COMPLETED_ALONE_S = 15.0  # an ordinary suspect's request alone
DROPS_LATE_AFTER_S = 15.0  # a poison prompt that streams a while, then loses its connection
FAR_FUTURE_S = 10 * 365 * 86_400.0  # a forged eta: ten years on
CALM_WAIT_S = 10.0  # a request waiting for a suspect's trial to end looks again this much later
FLAKY_EVERY_S = 2.0  # a flaky node's servers fail this often, as long as faults go on
# (the server failed, it came back) of an ordinary suspect's trial failed during the faults: an outage
# of its server's own, then back or never back (a rule missing that half would convict)
UNLUCKY_TRIALS = ((True, False), (True, True))
ACQUITTED_SHARE = 0.25  # an ordinary suspect completes its trial (its record starts over)


WEDGED_GAUGES = MetricsSnapshot(  # SGLang's gauges refresh at its decode-log interval: a wedge may freeze
    running_requests=0,  # them reading idle, its counters still
    queued_requests=0,
    generation_tokens_total=0.0,
    requests_total=0.0,
    decode_tokens_total=0.0,
)


def watch_calls_hung_at(started_s: float, timed_out_at_s: float) -> float | None:
    """When the liveness watch calls a server hung that a suspect's trial wedged at `started_s` (its last
    progress a poll later), its request out of the client's timeout at `timed_out_at_s`, then the suspect
    waiting for the server to answer again: the real judge, polled at its period over what the worker says
    waits on the server (`answers_awaited`); None when it never would (nothing changes after the timeout)."""
    stall_s = TRIAL_SETTINGS.silence_limit_s  # the watch's stall window, as trials read it
    judge = LivenessJudge(stall_s=stall_s, completion_stall_s=stall_s)
    at_s, gives_up_s = started_s + WEDGE_TIMED_S, timed_out_at_s + judge.stall_s + 2 * DEFAULT_LIVENESS_POLL_S
    while at_s <= gives_up_s:
        timed_out = at_s >= timed_out_at_s
        awaited = answers_awaited(1 if timed_out else 0, server_down=timed_out, canary_out=False)
        if judge.observe(at_s, WEDGED_GAUGES, (0 if timed_out else 1) + awaited).state is Liveness.HUNG:
            return at_s
        at_s += DEFAULT_LIVENESS_POLL_S
    return None


class PoisonKind(enum.Enum):
    """What a poison prompt does to its worker, every time it is sent."""

    WEDGES = "wedges its server"  # the whole server stops: the liveness watch suspends the worker
    HANGS = "hangs"  # its request never answers while the server answers others
    KILLS = "kills its worker"  # the worker process dies (a segfault, the OOM killer)
    DROPS_LATE = "drops its connection well into its answer"  # DROPS_LATE_AFTER_S in, the server answering


IN_FLIGHT_WHEN_SUSPENDED_SHARE = 0.5  # a prompt of a suspended worker was in flight (abandoned), not unsent
ENQUEUE_PARTS = (1, 2, 3)  # processes an enqueue runs in (producer/enqueue/processes.py), drawn each time
REQUEST_FATES = {ANSWERED: 0.75, REFUSED: 0.13, UNANSWERED: 0.12}
POISON_RAISES_IN_TASK = 0.5  # else in its tail, after the message was acknowledged
CONVERSATION_EVERY = 3  # prompts p000, p003, ... are conversations regenerated turn by turn
CONVERSATION_TURNS = (2, 3)
MS_PER_S = 1000
CLOCK_START_S = 1_000.0
SERVER_UP_BEFORE_S = 3_600.0  # how long Redis has served when a schedule starts

# Redis's clock-scored sets, and keys whose expiry is a lease: both age when time passes.
_PASS_TIME = """
local delta = tonumber(ARGV[1])
for i = 1, tonumber(ARGV[2]) do
  local flat = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
  for j = 1, #flat, 2 do redis.call('ZADD', KEYS[i], tonumber(flat[j + 1]) - delta, flat[j]) end
end
for i = tonumber(ARGV[2]) + 1, #KEYS do
  local left = redis.call('PTTL', KEYS[i])
  if left > 0 then
    if left <= delta * 1000 then redis.call('DEL', KEYS[i])
    else redis.call('PEXPIRE', KEYS[i], left - math.floor(delta * 1000)) end
  end
end
return 1
"""


def explored_prompt(index: int) -> Prompt:
    """Prompt `p<index>`: a conversation of 2 or 3 turns every CONVERSATION_EVERY-th, else one question."""
    one = prompt(f"p{index:03d}")
    if index % CONVERSATION_EVERY:
        return one
    turns = CONVERSATION_TURNS[index // CONVERSATION_EVERY % len(CONVERSATION_TURNS)]
    questions = [Message(role="user", content=f"{one.id} question {turn}") for turn in range(1, turns + 1)]
    return msgspec.structs.replace(one, messages=questions, turn_ends=list(range(1, turns + 1)))


def turn_answer(prompt_id: str, turn: int) -> str:
    """What the modelled server answers to a turn (the same on every delivery, as a seeded server does)."""
    return f"{prompt_id} answer {turn}"


class NodeRedis(GatedRedis):
    """A gated client of a GPU node's or the uploader's Redis user: it may call the protocol's functions
    but not load them (deploy/redis-users.acl), so a lost library stays lost until the producer loads it."""

    def function_load(self, *_args: Any, **_kwargs: Any) -> Any:
        self.scheduler.gate("FUNCTION LOAD")
        raise redis.exceptions.NoPermissionError("this user has no permissions to run 'function|load'")


SLEEP = "sleep"
SEAT_CHECK = "seat check"  # a step that is one turn of a worker's seat keeper


@dataclass(frozen=True)
class FleetShape:
    prompts: int
    batch_size: int
    workers: int
    poisoned: bool  # one batch's prompts make every attempt raise unexpectedly
    poison: tuple[PoisonKind, ...] = ()  # prompts poison to prove, each of its kind
    at_the_tail: bool = False  # the poison prompts are the run's last ones, not drawn among all


class FakeClock:
    """The lease keepers' monotonic clock: it moves only when the schedule makes time pass."""

    def __init__(self) -> None:
        self.now_s = CLOCK_START_S

    def __call__(self) -> float:
        return self.now_s


class InlineExecutor:
    """Stands in for enqueue's publishing thread: the step's own thread publishes (see the scheduler)."""

    def __init__(self, *_args: object, **_kwargs: object) -> None: ...

    def __enter__(self) -> InlineExecutor:
        return self

    def __exit__(self, *_exc: object) -> None: ...

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(function(*args))
        return done


class NoRenewer:
    """Stands in for enqueue's lease renewal thread: a lease runs out only when the schedule says so."""

    def __init__(self, *_args: object, **_kwargs: object) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Delivery:
    tag: str
    run: str
    batch_id: str
    eta_s: float
    priority: int  # the kombu priority step it was sent with: a task retry keeps it


GENERATE_LISTS = queue_lists(GENERATE_QUEUE)  # one per priority step, the first popped first


def generate_list(priority: int) -> str:
    """The list a generate message of this priority waits in (draftgen sends only kombu's steps)."""
    return GENERATE_LISTS[KOMBU_PRIORITY_STEPS.index(priority)]


class Bus:
    """The generate queue in kombu's Redis layout, worked through the steps' own gated clients: a list per
    priority step, a batch dispatched again once begun in the first, new work in the one its id's class
    names (workers/state/batch_priority.py). Messages
    are as enqueue and the reconciler send them (a real one, with another call and eta); what a worker pops
    is checked as its transport checks it (workers/broker/message_check.py), and a malformed item is parked,
    never delivered."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._tags = 0
        self.sent: set[bytes] = set()  # every message of draftgen's own, as published
        self.parked_ours: list[str] = []  # messages of draftgen's own that were parked (a violation)

    def envelope(self, run: str, batch_id: str, eta_s: float, priority: int) -> bytes:
        self._tags += 1
        real = envelope_of(real_generate_item())
        real["body"] = base64.b64encode(json.dumps([[run, batch_id], {}, NO_CHAIN]).encode()).decode()
        eta = datetime.fromtimestamp(eta_s, UTC).isoformat()
        real["headers"].update(id=f"{batch_id}-{self._tags}", eta=eta)
        real["properties"].update(delivery_tag=f"tag-{self._tags}", priority=priority)
        return encoded(real)

    def publish(
        self,
        client: redis.Redis,
        run: str,
        batch_id: str,
        *,
        countdown_s: float = 0.0,
        priority: int | None = None,
    ) -> None:
        """Send a batch's message at `priority`, by default the one its id names (as enqueue sends it)."""
        priority = batch_priority(batch_id) if priority is None else priority
        message = self.envelope(run, batch_id, self._clock.now_s + countdown_s, priority)
        self.sent.add(message)
        client.lpush(generate_list(priority), message)

    def fetch(self, client: redis.Redis) -> Delivery | None:
        """Pop the oldest message of the first priority list that holds one and record it unacknowledged,
        as kombu's channel does; a malformed one is parked instead."""
        popped = next(
            (
                (step, raw)
                for step, name in zip(KOMBU_PRIORITY_STEPS, GENERATE_LISTS, strict=True)
                if (raw := client.rpop(name)) is not None
            ),
            None,
        )
        if popped is None:
            return None
        step, raw = popped
        malformed = why_malformed(raw, GENERATE_QUEUE, now_s=self._clock.now_s)
        if malformed is not None:
            park(client, parked_message(raw, GENERATE_QUEUE, malformed, at=self._clock.now_s))
            if raw in self.sent:
                self.parked_ours.append(f"a message of draftgen's own was parked: {malformed}")
            return None
        self._tags += 1
        tag = f"tag-{self._tags}"
        message = json.loads(raw)
        client.hset(KOMBU_UNACKED_KEY, tag, json.dumps([message, "", GENERATE_QUEUE]))
        client.zadd(KOMBU_UNACKED_INDEX_KEY, {tag: self._clock.now_s})
        (run, batch_id), _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        eta_s = datetime.fromisoformat(message["headers"]["eta"]).timestamp()
        return Delivery(tag=tag, run=run, batch_id=batch_id, eta_s=eta_s, priority=step)

    def ack(self, client: redis.Redis, delivery: Delivery) -> None:
        with client.pipeline(transaction=False) as pipe:
            pipe.hdel(KOMBU_UNACKED_KEY, delivery.tag)
            pipe.zrem(KOMBU_UNACKED_INDEX_KEY, delivery.tag)
            pipe.execute()


@functools.cache
def real_generate_item() -> bytes:
    """A generate message exactly as Celery writes it (built once, in memory): each one published is a
    copy with its own call, id and eta."""
    return generate_item(RUN, "0" * 16)


def malformed_items(real: bytes) -> list[bytes]:
    """What a buggy producer, a truncated write or a node's password could push onto the generate queue."""
    return [
        b"x",
        b"[]",
        real[: len(real) // 2],
        replaced(real, body="not base64!"),
        with_body(real, {}),
        with_call(real, [RUN]),
        with_call(real, [RUN, ["not", "a", "batch id"]]),
        with_call(real, ["../not a run", "0" * 16]),
        changed(real, "headers", task="draftgen.unknown"),
        changed(real, "properties", delivery_tag=[1]),
        without_property(real, "delivery_tag"),
        b"{" * 40_000,
    ]


@dataclass
class Tail:
    """A batch whose message was acknowledged while some of its prompts are still being generated."""

    prompts: list[Prompt]
    job: ModelledJob
    poisoned: bool
    lease: Lease | None = None  # the lease its batch is held under, while it waits or is settled


@dataclass
class ModelledJob:
    handover: Handover
    still_held: Callable[[], bool]
    label: str  # the GPU whose server answers it
    outcome: BatchOutcome = field(default_factory=BatchOutcome)
    done: Future[BatchOutcome] = field(default_factory=Future)


class ModelledServer:
    """`GenerationEngine`'s face, answered by the schedule: some prompts now, the rest in a tail."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self.origin = Origin(host="explorer", gpu=None, server_url="http://modelled")

    def submit_batch(
        self,
        run: str,
        prompts: list[Prompt],
        sampling: SamplingSettings,
        handover: Handover,
        truncation: object = None,
        *,
        still_held: Callable[[], bool],
    ) -> BatchJob:
        fleet = self._worker.fleet
        poisoned = any(p.id in fleet.poison_prompts for p in prompts)
        if poisoned and fleet.rng.random() < POISON_RAISES_IN_TASK:
            raise RuntimeError("a bug this batch always meets")
        job = ModelledJob(handover, still_held, self._worker.process.name)
        answered_now = 0 if poisoned else fleet.rng.randint(0, len(prompts))  # it fails before any answer
        try:
            for one in prompts[:answered_now]:
                fleet.generate_one(job, one)
        except Exception as error:  # a hand-over Redis refused: the engine's future carries it
            job.done.set_exception(error)
        if job.done.done():
            pass
        elif answered_now == len(prompts) and not poisoned:
            job.done.set_result(job.outcome)
        else:
            lease = self._worker.keeper.lease_of(current_step())
            self._worker.tails.append(Tail(prompts[answered_now:], job, poisoned, lease))
        sent = threading.Event()
        sent.set()
        return BatchJob(sent, job.done)


class DetachedTails:
    """Where `_generate_leased` detaches a batch: its settling runs later, in a step of its own."""

    def __init__(self) -> None:
        self.settle_of: dict[int, Callable[[Future[BatchOutcome]], None]] = {}

    def detach(self, done: Future[BatchOutcome], settle: Callable[[Future[BatchOutcome]], None]) -> None:
        self.settle_of[id(done)] = settle


class ModelledServerRecord:
    def __init__(self, origin: Origin) -> None:
        self._origin = origin

    def refresh(self) -> Origin:
        return self._origin


class GivingUpKeeper(LeaseKeeper):
    """A LeaseKeeper that tells the fleet whenever a lease of its is gone from Redis by its own doing,
    and remembers which step took each lease."""

    def __init__(
        self, client: redis.Redis, *, worker: str, seat: str, clock: FakeClock, fleet: Fleet
    ) -> None:
        super().__init__(client, worker=worker, seat=seat, clock=clock)
        self._fleet = fleet
        self.taken_by: dict[Lease, Step | None] = {}

    def acquire(self, run: str, batch_id: str) -> tuple[Acquired, Lease]:
        outcome, lease = super().acquire(run, batch_id)
        if outcome is Acquired.ACQUIRED:
            self.taken_by[lease] = current_step()
        return outcome, lease

    def lease_of(self, step: Step | None) -> Lease | None:
        """The lease `step` took last."""
        taken = [lease for lease, by in self.taken_by.items() if by is step]
        return taken[-1] if taken else None

    def renewed(self) -> list[Lease]:
        """The leases this keeper renews: held and not found lost."""
        with self._lock:
            return [lease for lease, tracked in self._held.items() if not tracked.lost]

    def release(self, lease: Lease, *, delay_s: float) -> bool:
        released = super().release(lease, delay_s=delay_s)
        self._fleet.lease_gone(lease.holder.owner)
        return released

    def finish(self, lease: Lease, prompt_ids: Sequence[str]) -> list[str]:
        unsettled = super().finish(lease, prompt_ids)
        if not unsettled:
            self._fleet.lease_gone(lease.holder.owner)
        return unsettled


class HarnessContext:
    """What `handle_generate` and `_settle_tail` read of a WorkerContext, over the modelled server."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self.redis: redis.Redis = worker.client
        self.leases = worker.keeper
        self.stopping = threading.Event()
        self.settings = WorkerSettings()
        self.engine = ModelledServer(worker)
        self.tails = worker.detached
        self.batch_life = BatchLife(GENERATE_TASK)  # no dispatcher: its events go nowhere
        self.server_record = ModelledServerRecord(self.engine.origin)

    def run_settings(self, run: str) -> RunSettings:
        return self._worker.fleet.settings

    def dispatch_generate(
        self, run: str, batch_id: str, *, countdown_s: float, resumed: bool = False
    ) -> None:
        self._worker.fleet.bus.publish(self.redis, run, batch_id, countdown_s=countdown_s)

    def dispatch_flush(self, run: str) -> None:
        self._worker.fleet.flush_requests.append(run)


class StepDispatcher:
    """The reconciler's messages, sent through its step's own client."""

    def __init__(self, fleet: Fleet, client: redis.Redis) -> None:
        self._fleet = fleet
        self._client = client

    def generate(self, run: str, batch_id: str, *, countdown_s: float = 0.0, resumed: bool = False) -> None:
        priority = RESUMED_BATCH_PRIORITY if resumed else batch_priority(batch_id)
        self._fleet.bus.publish(self._client, run, batch_id, countdown_s=countdown_s, priority=priority)

    def flush(self, run: str) -> None:
        self._fleet.flush_requests.append(run)


class Worker:
    """A generate worker process: it takes its GPU label's seat (workers/bootsteps/seating.py) and then
    its steps are deliveries, tails, renewals, seat checks and reconcile passes."""

    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.process = Process(name)
        self.client = NodeRedis(fleet.redis_url, fleet.scheduler)
        self.seat = fleet.seat_of(self.client, name, on_lost=self._seat_lost)
        self.keeper = GivingUpKeeper(
            self.client, worker=name, seat=self.seat.token, clock=fleet.clock, fleet=fleet
        )
        self.seated = False
        self.keeper_started = False  # its seat taken and stamped: its keeper thread turns
        self.tails: list[Tail] = []
        self.settling: dict[Lease, Step | None] = {}  # tails being settled: their lease -> the step
        self.held: list[Delivery] = []  # delivered, waiting for their countdown (Celery keeps them)
        self.detached = DetachedTails()
        self.context = HarnessContext(self)
        self.steadiness = Steadiness(since=fleet.clock.now_s)  # its server's record, as it saw it
        self.alone = False  # a suspect holds its server alone

    def take_seat(self) -> None:
        """What a worker does before it consumes: take its seat, then what its dead predecessor held. A
        seat a live process holds ends this one (EXIT_SEAT_HELD; systemd starts it again later)."""
        try:
            taken = self.seat.take()
        except SeatHeld:
            self.process.dead = True  # it exits; its subscription went with the refusal
            return
        self.keeper_started = True
        self.fleet.seat_taken(self.process.name, taken)
        take_back_after_death(
            self.client, self.reconciler(), taken, self.process.name, clock=self.fleet.clock
        )
        self.seated = True

    def life(self) -> str:
        """Its server's life as the engine names it in poison records."""
        return f"{self.process.name}#{server_identity(self.seat.token)}.{self.steadiness.lives}"

    def check_seat(self) -> None:
        """The seat's keeper, as its thread runs every half second."""
        with contextlib.suppress(redis.ConnectionError):
            self.seat.check()

    def _seat_lost(self, reason: str) -> None:
        if not self.process.dead:
            self.fleet.seat_losses.append(f"{self.process.name}, alive, was told: {reason}")

    def unaccounted_leases(self) -> list[Lease]:
        """Leases this worker renews that no execution of it holds any more: not the step that took it
        (running), not a tail waiting to be settled, not a tail being settled."""
        waiting = {tail.lease for tail in self.tails}
        found = []
        for lease in self.keeper.renewed():
            taker = self.keeper.taken_by.get(lease)
            settler = self.settling.get(lease)
            if lease in waiting or (taker is not None and not taker.ended):
                continue
            if lease in self.settling and (settler is None or not settler.ended):
                continue
            found.append(lease)
        return found

    def reconciler(self) -> Reconciler:
        settings = ReconcileSettings(upload_max_age_s=UploadSettings().max_age_s)
        return Reconciler(self.client, StepDispatcher(self.fleet, self.client), settings)

    def deliver(self) -> None:
        delivery = self.fleet.bus.fetch(self.client)
        if delivery is None:
            return
        if delivery.eta_s > self.fleet.clock.now_s:
            self.held.append(delivery)
            return
        self.run_task(delivery)

    def run_due(self) -> None:
        due = [d for d in self.held if d.eta_s <= self.fleet.clock.now_s]
        if due:
            self.held.remove(due[0])
            self.run_task(due[0])

    def run_task(self, delivery: Delivery) -> None:
        """What the Celery task `draftgen.generate` does with one message (workers/tasks.py)."""
        context = cast(WorkerContext, self.context)
        try:
            report = handle_generate(context, delivery.run, delivery.batch_id)
        except RetryLater as error:  # a retry keeps its message's priority unless its work began
            priority = RESUMED_BATCH_PRIORITY if error.resumed else delivery.priority
            self.fleet.bus.publish(
                self.client, delivery.run, delivery.batch_id, countdown_s=error.delay_s, priority=priority
            )
            self.fleet.bus.ack(self.client, delivery)
            return
        except RunBroken:
            self.fleet.bus.ack(self.client, delivery)
            return
        self.fleet.bus.ack(self.client, delivery)
        if report.handed_over:
            self.fleet.flush_requests.append(delivery.run)

    def settle_tail(self) -> None:
        tail = self.tails.pop(0)
        if tail.lease is not None:
            self.settling[tail.lease] = current_step()
        try:
            for one in [] if tail.poisoned else tail.prompts:
                self.fleet.generate_one(tail.job, one)
        except Exception as error:  # a hand-over Redis refused: the engine's future carries it
            tail.job.done.set_exception(error)
        settle = self.detached.settle_of.pop(id(tail.job.done))
        if tail.job.done.done():
            pass
        elif tail.poisoned:
            tail.job.done.set_exception(RuntimeError("a bug this batch always meets"))
        else:
            tail.job.done.set_result(tail.job.outcome)
        settle(tail.job.done)

    def renew(self) -> None:
        """A turn of the renewal thread (workers/periodic.py logs a missing library and goes on)."""
        with contextlib.suppress(FunctionsMissing):
            self.keeper.renew()

    def reconcile(self) -> None:
        with contextlib.suppress(FunctionsMissing):
            self.reconciler().reconcile_all()


class Twin:
    """A second generate worker started by mistake on a GPU label (or on a host of the same name): it must
    be refused while the label's worker lives. Given the seat (its holder was gone), it takes back what
    that holder held and stops cleanly, as a worker stopped at once would."""

    def __init__(self, fleet: Fleet, label: str) -> None:
        self.fleet = fleet
        self.label = label
        self.process = Process(f"{label}-twin")
        self.client = NodeRedis(fleet.redis_url, fleet.scheduler)

    def take_seat(self) -> None:
        seat = self.fleet.seat_of(self.client, self.label, on_lost=lambda _reason: None)
        try:
            taken = seat.take()
        except SeatHeld:
            return
        self.fleet.seat_taken(self.label, taken)
        settings = ReconcileSettings(upload_max_age_s=UploadSettings().max_age_s)
        reconciler = Reconciler(self.client, StepDispatcher(self.fleet, self.client), settings)
        take_back_after_death(self.client, reconciler, taken, self.label, clock=self.fleet.clock)
        seat.release()


class UploaderProcess:
    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.process = Process(name)
        self.client = NodeRedis(fleet.redis_url, fleet.scheduler)
        self.uploader = Uploader(self.client, UploadSettings(), lambda _run: fleet.store)

    def flush(self) -> None:
        run = self.fleet.flush_requests.pop(0)
        try:
            report = self.uploader.flush(run)
        except RetryLater as error:  # Celery sends it again after its countdown
            self.fleet.flush_requests.append(run)
            self.fleet.flush_due_at_s = self.fleet.clock.now_s + error.delay_s
            return
        except Killed:  # its message is unacknowledged: Celery delivers it again
            self.fleet.flush_requests.append(run)
            raise
        for batch_id in report.reopened_batches:  # as the flush task does (workers/tasks.py)
            self.fleet.bus.publish(self.client, run, batch_id)


class EnqueueProcess:
    """`enqueue` of the whole input: in one process, or (`parts` > 1) as producer/enqueue/processes.py does
    it: this process takes the lease and opens the enqueue, then parts of their own (`EnqueuePart`)
    classify, claim and publish each its share of the ids, and once they have ended it gives the lease up
    (the explorer starts the parts and the release: see Explorer._advance_enqueues_in_parts)."""

    def __init__(self, fleet: Fleet, name: str, parts: int) -> None:
        self.fleet = fleet
        self.process = Process(name)
        self.client = GatedRedis(fleet.redis_url, fleet.scheduler)
        self.busy = False
        self.parts = parts
        self.opened: EnqueueSession | None = None  # set once its parts can start
        self.started_parts: list[EnqueuePart] = []
        self.released = False
        self._enqueuer: Enqueuer | None = None

    def enqueue(self) -> None:
        self._enqueuer = self.fleet.enqueuer(self.client)
        try:
            if self.parts == 1:
                self._enqueuer.enqueue(self.fleet.input_rows)
                return
            self._enqueuer.take_lease()
            self._enqueuer.open()
            self.opened = self._enqueuer.session
        except EnqueueBusy:
            self.busy = True

    def start_parts(self) -> list[EnqueuePart]:
        """The parts, each with the chunks of its share of the input."""
        assert self.opened is not None and self._enqueuer is not None
        rows = self._enqueuer.chunk_rows
        dealt_chunks = list(dealt(self.fleet.input_rows, self.parts, rows))
        self.started_parts = [
            EnqueuePart(
                self.fleet,
                f"{self.process.name}.part{index}",
                self.opened,
                [chunk for part, chunk in dealt_chunks if part == index],
            )
            for index in range(self.parts)
        ]
        return self.started_parts

    def release(self) -> None:
        assert self._enqueuer is not None
        self.released = True
        self._enqueuer.release_lease()


class EnqueuePart:
    """A part process of an enqueue: its chunks enqueued under the enqueue's lease and number."""

    def __init__(
        self, fleet: Fleet, name: str, session: EnqueueSession, chunks: list[list[Prompt | RejectedRow]]
    ) -> None:
        self.process = Process(name)
        self._fleet = fleet
        self._session = session
        self._chunks = chunks

    def enqueue(self) -> None:
        enqueuer = self._fleet.enqueuer(GatedRedis(self._fleet.redis_url, self._fleet.scheduler))
        with contextlib.suppress(EnqueueBusy):  # the lease was lost: the real part reports it and ends
            enqueuer.enqueue_part(self._session, self._chunks)


@dataclass
class Snapshot:
    taken: RedisSnapshot
    at_action: int
    time_passed_s: float


class Fleet:
    """Every process, the queue, the clock and the output of one explored schedule."""

    def __init__(
        self, redis_url: str, output: Path, rng: random.Random, scheduler: Scheduler, shape: FleetShape
    ) -> None:
        self.redis_url = redis_url
        self.rng = rng
        self.scheduler = scheduler
        self.shape = shape
        self.clock = FakeClock()
        self.bus = Bus(self.clock)
        self.admin = redis.Redis.from_url(redis_url)  # the harness's own, never gated
        self.store = FolderStore(output)
        self.settings = RunSettings(
            run=RUN, sampling=SamplingSettings(), output=self.store.url, batch_size=shape.batch_size
        )
        self.prompts = [msgspec.structs.replace(explored_prompt(i), row=i + 1) for i in range(shape.prompts)]
        # the input: every prompt, then each again in reverse order: duplicate rows, each id batched once
        # whichever parts of an enqueue read its rows
        again = reversed(self.prompts)
        self.input_rows = [
            *self.prompts,
            *(msgspec.structs.replace(one, row=shape.prompts + n) for n, one in enumerate(again, 1)),
        ]
        first_poisoned = rng.randrange(0, shape.prompts, shape.batch_size)
        self.poison_prompts = (
            {p.id for p in self.prompts[first_poisoned : first_poisoned + shape.batch_size]}
            if shape.poisoned
            else set()
        )
        ordinary = [p.id for p in self.prompts if not p.turn_ends and p.id not in self.poison_prompts]
        count = min(len(shape.poison), len(ordinary))
        placed = ordinary[len(ordinary) - count :] if shape.at_the_tail else rng.sample(ordinary, count)
        self.poison_kinds: dict[str, PoisonKind] = dict(zip(placed, shape.poison, strict=False))
        self.trials = 0
        self.calm = False  # faults are over: the servers fail no more but for the poison planted
        self.prompt_kills: list[Process] = []  # workers a prompt killed in the last action
        self.tried_when_calm: set[str] = set()  # prompts tried alone once faults were over
        self.wake_at: dict[int, float] = {}  # a sleeping step's (by id) time to wake
        self.flush_due_at_s = 0.0  # a flush that must wait (its lock busy) runs again from then
        self.flush_requests: list[str] = []
        self.workers = [Worker(self, f"gpu{i}") for i in range(shape.workers)]
        self.uploader = UploaderProcess(self, "uploader")
        self.enqueues: list[EnqueueProcess] = []
        self.action = 0
        self.time_passed_s = 0.0
        self.gone_leases: dict[str, int] = {}  # owner token -> action at which its holder gave it up
        self.snapshots: list[Snapshot] = []
        self.hung_servers: set[str] = set()  # GPUs whose liveness watch suspended their worker's engine
        self.flaky_servers: set[str] = set()  # GPUs whose server fails every FLAKY_EVERY_S until faults stop
        self.server_epoch = 0  # which Redis server the real one stands for: a rollback starts another
        self.server_up_since_s = self.clock.now_s - SERVER_UP_BEFORE_S
        self.forged: set[str] = set()  # staged fields a forger wrote
        self.seat_losses: list[str] = []  # live workers told their seat was taken
        self.seat_violations: list[str] = []  # seats taken from a live holder
        self.twins: list[Twin] = []
        self._pass_time = self.admin.register_script(_PASS_TIME)
        # loaded before any step runs: a first FCALL that misses would add calls, and so turns, to
        # whichever schedule runs first in a fresh redis-server
        LIBRARY.load(self.admin)
        pin_settings(self.admin, self.settings)
        write_run_json(self.store, self.settings)

    # ------------------------------------------------------------------ what processes do

    def generate_one(self, job: ModelledJob, one: Prompt) -> None:
        """A prompt's requests, one per turn: each answered, refused (the prompt is dead-lettered) or
        unanswered (left pending: a suspicion of the prompt, and a suspect's request is a trial, see
        `_trial`); a poison prompt's never answered, or its worker killed. The last turn's answer stages
        the prompt, whole."""
        finished = job.handover.kept_turns([one.id]).get(one.id, []) if one.turn_ends else []
        for turn in range(len(finished) + 1, one.turn_count + 1):
            if not job.still_held():
                job.outcome.unreachable.append(one.id)
                job.outcome.last_error = "lease lost"
                return
            if job.label in self.hung_servers:
                self._abandoned(job, one)
                return
            fate = self.rng.choices(list(REQUEST_FATES), weights=list(REQUEST_FATES.values()))[0]
            kind = self.poison_kinds.get(one.id)
            evidence = job.handover.strikes_of([one.id]).get(one.id, [])
            verdict = POISON_POLICY.judge(evidence)
            if verdict is Verdict.AS_USUAL and not self._alone_done(job):
                job.outcome.unreachable.append(one.id)  # its worker was suspended, or its lease lost
                return
            if verdict is Verdict.DEAD:  # proven by trials whose worker died before its dead letter
                fate = self._dead_letter_poison(job, one, evidence)
            elif verdict is Verdict.TRIAL:
                fate = self._trial(job, one, evidence)
            elif kind is not None:
                fate = self._poison_in_company(job, one, kind)
            elif fate == UNANSWERED:
                fate = self._suspected(job, one, with_server=False)
            if fate == UNANSWERED:
                job.outcome.unreachable.append(one.id)
                job.outcome.last_error = "no answer from the modelled server"
                return
            if fate == POISON:
                return
            if fate == ANSWERED:
                self.worker_of(job).steadiness.served(self.clock.now_s)
            if fate == ANSWERED and turn < one.turn_count:
                finished.append(completion(one.id, content=turn_answer(one.id, turn)).as_turn())
                job.handover.keep_turns(one.id, finished)
                continue
            self._settle_one(job, one, fate, turn, finished)
            return

    def worker_of(self, job: ModelledJob) -> Worker:
        (worker,) = [w for w in self.workers if w.process.name == job.label and not w.process.dead] or [
            w for w in self.workers if w.process.name == job.label
        ][-1:]
        return worker

    def _abandoned(self, job: ModelledJob, one: Prompt) -> None:
        """The liveness watch suspended the engine (its server hung): a request in flight is abandoned, a
        suspicion of its prompt with the server; one not sent yet stays pending, suspected of nothing."""
        job.outcome.unreachable.append(one.id)
        job.outcome.last_error = "the server hung: the worker is suspended"
        if self.rng.random() < IN_FLIGHT_WHEN_SUSPENDED_SHARE:
            self._strike_suspicion(job, one, cause="hung", with_server=True)

    def _poison_in_company(self, job: ModelledJob, one: Prompt, kind: PoisonKind) -> str:
        """A poison prompt sent among others: it wedges the server (the liveness watch suspends the engine,
        its watch restarts the server), hangs alone while the others stream (cut for silence), or kills
        its worker."""
        if kind is PoisonKind.KILLS:
            self._die(job)
        return self._suspected(job, one, with_server=kind is PoisonKind.WEDGES)

    def _suspected(self, job: ModelledJob, one: Prompt, *, with_server: bool) -> str:
        """A request that got no answer: a failure of its server as the worker records it (with the server:
        it went down, and came back), and a suspicion of its prompt."""
        server = self.worker_of(job).steadiness
        server.failed(self.clock.now_s, server_down=with_server)
        server.back(self.clock.now_s)
        return self._strike_suspicion(
            job, one, cause="hung" if with_server else "dropped", with_server=with_server
        )

    def _strike_suspicion(self, job: ModelledJob, one: Prompt, *, cause: str, with_server: bool) -> str:
        """The suspicion, recorded with the real `strike` function. The record as it comes back may already
        prove the prompt poison (another worker's convictions): POISON, else still UNANSWERED."""
        suspicion = Suspicion(
            life=self.worker_of(job).life(), cause=cause, with_server=with_server, at=self.clock.now_s
        )
        evidence = job.handover.strike(one.id, suspicion)
        if POISON_POLICY.judge(evidence) is Verdict.DEAD:
            return self._dead_letter_poison(job, one, evidence)
        return UNANSWERED

    def _die(self, job: ModelledJob) -> None:
        """The prompt kills its worker process here, as SIGKILL would: the explorer kills what else of it
        runs once this action ends."""
        process = self.worker_of(job).process
        process.dead = True
        self.prompt_kills.append(process)
        raise Killed

    def _wait_until(self, moment_s: float) -> None:
        while self.clock.now_s < moment_s:
            self.sleep(moment_s - self.clock.now_s)

    def _trial(self, job: ModelledJob, one: Prompt, evidence: list[Evidence]) -> str:
        """A suspect's request, alone, as `Tribunal.trial` runs it: it waits for the control its record
        asks of the worker's server (the real rule, on the schedule's clock), is recorded begun, then ended
        (a kill between leaves it to the worker's successor). A poison prompt fails it as its kind does: a
        wedge the stall window long, a hang the client's timeout long, or its worker killed; an ordinary one
        completes it (acquitted), or during the faults may fail it with an outage of its server's own, which
        proves nothing. Three convictions dead-letter the prompt as poison. Returns the request's fate."""
        worker, kind = self.worker_of(job), self.poison_kinds.get(one.id)
        server = worker.steadiness
        needed_s = POISON_POLICY.control_before_trial_s(evidence, TRIAL_SETTINGS.timing_floor_s)
        until = self.clock.now_s + CONTROL_WAIT_FACTOR * needed_s
        while True:
            while (wait_s := control_wait_s(server, self.clock.now_s, needed_s, until)) > 0:
                if not job.still_held() or job.label in self.hung_servers:
                    return UNANSWERED  # not tried: its batch given up, or its worker suspended
                self.sleep(wait_s)
            if not self._alone_done(job):
                return UNANSWERED
            if control_wait_s(server, self.clock.now_s, needed_s, until) == 0:
                break  # (a failure while another suspect had the server: wait for the control again)
        worker.alone = True  # the whole server: nothing else of the worker is sent until its trial ends
        try:
            return self._tried_alone(job, one, kind, needed_s)
        finally:
            worker.alone = False

    def _alone_done(self, job: ModelledJob) -> bool:
        """Wait until no suspect holds the worker's server alone (`GenerationEngine._slot`); False when the
        job is given up meanwhile (its worker suspended, or its lease lost)."""
        while self.worker_of(job).alone:
            if not job.still_held() or job.label in self.hung_servers:
                return False
            self.sleep(CALM_WAIT_S)
        return True

    def _tried_alone(self, job: ModelledJob, one: Prompt, kind: PoisonKind | None, needed_s: float) -> str:
        worker = self.worker_of(job)
        server = worker.steadiness
        started = self.clock.now_s
        self.trials += 1
        if self.calm:
            self.tried_when_calm.add(one.id)
        begun = TrialBegun(
            trial=f"trial-{self.trials}",
            life=worker.life(),
            started_at=started,
            canary_before_s=0.0,
            control_s=server.control_s(started),
            mean_up_s=server.mean_up_s(started, control_window_s(needed_s)),
        )
        job.handover.strike(one.id, begun)
        server.trial_began(started)
        if kind is PoisonKind.KILLS:
            self._die(job)
        if kind is None and (self.calm or self.rng.random() < ACQUITTED_SHARE):
            self._wait_until(started + (COMPLETED_ALONE_S if self.calm else 0.0))
            job.handover.strike(one.id, begun.end(TrialEnd.COMPLETED))
            server.trial_completed()
            return ANSWERED
        ended = self._failed_trial(job, begun, kind)
        evidence = job.handover.strike(one.id, ended)
        if POISON_POLICY.judge(evidence) is not Verdict.DEAD:
            return UNANSWERED
        return self._dead_letter_poison(job, one, evidence)

    def _failed_trial(self, job: ModelledJob, begun: TrialBegun, kind: PoisonKind | None) -> TrialEnded:
        """How a suspect's trial fails, timed as the engine times it (`trials.failed_after_s`)."""
        server, started = self.worker_of(job).steadiness, begun.started_at
        if kind is None:  # an outage of the server's own; it answers no canary within the comeback limit
            server.trial_failed(started, server_down=True)
            server.back(started)
            return begun.end(TrialEnd.WENT_DOWN, failed_after_s=0.0, canary_after_s=None)
        if kind is PoisonKind.WEDGES:  # out of the client's timeout, no canary answered; then the watch
            self._wait_until(started + REQUEST_TIMEOUT_S)  # calls the server hung, and restarts it
            error = InferenceUnavailable("Request timed out.", cause=FailureCause.TIMED_OUT)
            ending = trial_end(error, server_answers=False)
            timed_out_at = self.clock.now_s
            took_s = failed_after_s(
                error, ending, started=started, last_sign=started + FIRST_CHUNK_S, failed_at=timed_out_at
            )
            server.trial_failed(timed_out_at, server_down=True)
            called_hung_at = watch_calls_hung_at(started, timed_out_at)
            # never called hung, nobody restarts the server: the suspect waits on it for ever
            self._wait_until(math.inf if called_hung_at is None else called_hung_at)
            hung = Outage(Liveness.HUNG.value, stalled_since=started + WEDGE_TIMED_S)
            ending, took_s = retimed(ending, took_s, hung, started=started)
            self._wait_until(self.clock.now_s + RESTART_S)
            server.served(self.clock.now_s)
            if not job.still_held():
                return begun.end(TrialEnd.GIVEN_UP, note="batch lease lost")
            canary_after_s = self.clock.now_s - timed_out_at
            return begun.end(ending, failed_after_s=took_s, canary_after_s=canary_after_s)
        if kind is PoisonKind.DROPS_LATE:  # its connection lost mid-answer, the server answering a canary
            self._wait_until(started + DROPS_LATE_AFTER_S)
            error = InferenceUnavailable("Connection reset by peer", cause=FailureCause.DROPPED)
            ending = trial_end(error, server_answers=True)
            took_s = failed_after_s(
                error, ending, started=started, last_sign=self.clock.now_s, failed_at=self.clock.now_s
            )
            server.trial_failed(self.clock.now_s, server_down=False)
            return begun.end(ending, failed_after_s=took_s, canary_after_s=0.0)
        # HANGS: out of the client's timeout, the server answering others
        self._wait_until(started + REQUEST_TIMEOUT_S)
        error = InferenceUnavailable("Request timed out.", cause=FailureCause.TIMED_OUT)
        ending = trial_end(error, server_answers=True)
        took_s = failed_after_s(
            error, ending, started=started, last_sign=started + FIRST_CHUNK_S, failed_at=self.clock.now_s
        )
        server.trial_failed(self.clock.now_s, server_down=False)
        if not job.still_held():
            return begun.end(TrialEnd.GIVEN_UP, note="batch lease lost")
        return begun.end(ending, failed_after_s=took_s, canary_after_s=0.0)

    def _dead_letter_poison(self, job: ModelledJob, one: Prompt, evidence: list[Evidence]) -> str:
        """Dead-letters a prompt its record proves poison, with that record described; returns POISON."""
        letter = DeadLetter(
            prompt_id=one.id,
            row=one.row,
            reason=DeadLetterReason.POISON_PROMPT,
            error=describe(evidence, POISON_POLICY),
            attempts=len(evidence),
        )
        if job.handover.dead_letter(letter):
            job.outcome.dead_lettered += 1
        else:
            job.outcome.already_handled += 1
        return POISON

    def _settle_one(self, job: ModelledJob, one: Prompt, fate: str, turn: int, finished: list[Turn]) -> None:
        if fate == ANSWERED:
            last = completion(one.id, content=turn_answer(one.id, turn))
            if one.turn_ends:
                last = msgspec.structs.replace(
                    last, earlier_turns=finished, conversation_turns=one.turn_count
                )
            handed = job.handover.stage(last)
        else:
            letter = DeadLetter(
                prompt_id=one.id,
                row=one.row,
                reason=DeadLetterReason.REJECTED_BY_SERVER,
                error="HTTP 400",
                attempts=1,
                turn=turn if one.turn_ends else 0,
            )
            handed = job.handover.dead_letter(letter)
        if not handed:
            job.outcome.already_handled += 1
        elif fate == ANSWERED:
            job.outcome.staged += 1
        else:
            job.outcome.dead_lettered += 1

    def store_parts(self) -> int:
        """Parts committed to the output so far."""
        return sum(1 for _ in self.store.list(MANIFEST_PREFIX))

    def lease_gone(self, owner: str) -> None:
        self.gone_leases[owner] = self.action

    # ------------------------------------------------------------------ processes

    def live(self) -> Iterable[Worker | UploaderProcess | EnqueueProcess]:
        processes: list[Worker | UploaderProcess | EnqueueProcess] = [
            *self.workers,
            self.uploader,
            *self.enqueues,
        ]
        for process in processes:
            if not process.process.dead:
                yield process

    def new_enqueue(self) -> EnqueueProcess:
        parts = self.rng.choice(ENQUEUE_PARTS)
        process = EnqueueProcess(self, f"enqueue{len(self.enqueues)}", parts)
        self.enqueues.append(process)
        return process

    def enqueuer(self, client: GatedRedis) -> Enqueuer:
        """An enqueue's code on `client`, publishing through it."""

        def publish(run: str, batch_ids: Sequence[str]) -> None:
            for batch_id in batch_ids:
                self.bus.publish(client, run, batch_id)

        return Enqueuer(client, self.settings, publish, source="explored.jsonl", store=self.store)

    def restart(self, name: str) -> Worker | None:
        """Start a process anew in the place of a dead one (systemd's Restart=always); a generate
        worker, returned, has yet to take its seat."""
        if self.uploader.process.name == name and self.uploader.process.dead:
            self.uploader = UploaderProcess(self, name)
        for index, worker in enumerate(self.workers):
            if worker.process.name == name and worker.process.dead:
                self.workers[index] = Worker(self, name)
                return self.workers[index]
        return None

    def close_sockets(self, process: Process) -> None:
        """The kernel closes a dead process's sockets: a generate worker's seat subscription goes."""
        for worker in self.workers:
            if worker.process is process:
                worker.seat._close_subscription()

    def seat_taken(self, label: str, taken: TakenSeat) -> None:
        """A seat was taken from `taken.previous`: that process must be dead (or have given it up)."""
        for worker in self.workers:
            if worker.seat.token == taken.previous and not worker.process.dead:
                self.seat_violations.append(
                    f"{label}'s seat was taken from its live holder at action {self.action}"
                )

    def new_twin(self, label: str) -> Twin:
        twin = Twin(self, label)
        self.twins.append(twin)
        return twin

    def library_loaded(self) -> bool:
        return bool(self.admin.function_list(library=LIBRARY.name))

    def lose_the_library(self) -> bool:
        """The protocol's functions are gone (FUNCTION DELETE, a Redis rebuilt without them)."""
        if not self.library_loaded():
            return False
        self.admin.function_delete(LIBRARY.name)
        return True

    def load_the_library(self) -> bool:
        """The operator runs `python -m producer load-functions` (or an enqueue loads them)."""
        return LIBRARY.load(self.admin)

    def hang_server(self, label: str) -> bool:
        """The GPU's server hangs: its worker's liveness watch suspends the engine and stops consuming
        (workers/generate/liveness.py) until the server generates again: a failure of its server."""
        self.hung_servers.add(label)
        for worker in self.workers:
            if worker.process.name == label:
                worker.steadiness.failed(self.clock.now_s, server_down=True)
        return True

    def turn_flaky(self) -> bool:
        """The node's servers fail every FLAKY_EVERY_S from now on, whatever they serve (a bad driver, a
        flaky node: every GPU of it), until faults stop: each worker sees each failure as time passes."""
        labels = {worker.process.name for worker in self.workers}
        if labels <= self.flaky_servers:
            return False
        self.flaky_servers |= labels
        return True

    def _flaky_failures(self, since_s: float, until_s: float) -> None:
        """The failures of the flaky servers between two moments, as their workers see them."""
        for worker in self.workers:
            if worker.process.name not in self.flaky_servers or worker.process.dead:
                continue
            at_s = since_s + FLAKY_EVERY_S
            while at_s <= until_s:
                worker.steadiness.failed(at_s, server_down=True)
                worker.steadiness.back(at_s)
                at_s += FLAKY_EVERY_S

    def server_back(self, label: str) -> bool:
        """The server generates again (restarted by the watch): the engine resumes, the worker consumes."""
        self.hung_servers.discard(label)
        for worker in self.workers:
            if worker.process.name == label:
                worker.steadiness.back(self.clock.now_s)
        return True

    def unsubscribe(self) -> bool:
        """Redis restarts (or fails over, or resets connections): every subscription is gone."""
        self.admin.client_kill_filter(_type="pubsub")
        return True

    # ------------------------------------------------------------------ time and Redis faults

    def pass_time(self, seconds: float) -> None:
        """Every lease, grace period, upload age, lock lease and seat stamp ages by `seconds`; the seat
        keeper of every live worker that holds its seat runs meanwhile (its thread turns twice a second)."""
        for worker in self.workers:
            if worker.seat.taken and not worker.process.dead:
                self._land_seat_stamp(worker)
        self._flaky_failures(self.clock.now_s, self.clock.now_s + seconds)
        self.clock.now_s += seconds
        self.time_passed_s += seconds
        self._age_redis(seconds)
        for worker in self.workers:
            if worker.seat.taken and not worker.process.dead:
                worker.check_seat()

    def _land_seat_stamp(self, worker: Worker) -> None:
        """Let the seat stamp `worker` has in flight land before time passes, as it does in reality: its
        keeper is one thread, whose check (or take()'s first stamp, before it starts the keeper) ends in
        milliseconds, before its next. Left parked, it would land after the check `pass_time` runs and
        undo that stamp: one read on a server a rollback replaced makes a live keeper look silent, and a
        newcomer's watch takes its seat."""
        for step in self.scheduler.parked():
            if step.process is not worker.process:
                continue
            while not step.ended and (step.what == SEAT_CHECK or not worker.keeper_started):
                self.scheduler.grant(step)

    def _age_redis(self, seconds: float) -> None:
        keys = RunKeys(RUN)
        scored = [
            keys.leases,
            keys.open_batches,
            keys.staged_index,
            keys.dead_pending,
            KOMBU_UNACKED_INDEX_KEY,
        ]
        leased = [keys.enqueue_lock, keys.upload_lock, RECONCILER_LOCK_KEY]
        self._pass_time(keys=[*scored, *leased], args=[seconds, len(scored)])
        for key in self.admin.scan_iter(match=f"{SEATS_KEY_PREFIX}*:seen"):
            stamp = decode_stamp(self.admin.get(key))
            if stamp is not None:
                self.admin.set(key, encode_stamp(dataclasses.replace(stamp, at_s=stamp.at_s - seconds)))

    def seat_of(self, client: redis.Redis, label: str, *, on_lost: Callable[[str], None]) -> Seat:
        """A GPU label's seat on the schedule's clock and server."""
        clock, sleep, server = self.clock, self.sleep, self.view_server
        return Seat(client, label, on_lost=on_lost, clock=clock, sleep=sleep, server=server)

    def sleep(self, seconds: float) -> None:
        """A step's pause: it parks until the explorer wakes it, as rarely as time passes (once faults are
        over, once the time it sleeps for has passed)."""
        step = current_step()
        if step is not None:
            self.wake_at[id(step)] = self.clock.now_s + seconds
        self.scheduler.gate(SLEEP)

    def next_wake_s(self, parked: list[Step]) -> float | None:
        """When the first of the sleeping steps among `parked` wakes (None: none sleeps)."""
        wakes = [self.wake_at.get(id(step), self.clock.now_s) for step in parked if step.parked_at == SLEEP]
        return min(wakes, default=None)

    def view_server(self, client: Any) -> ServerView:
        """The Redis server as a seat sees it: its clock (Redis's own, aged with the rest), and the identity
        and uptime of the server it stands for (a rollback is a restart: another server, up since then)."""
        seconds, microseconds = client.time()
        now_s = float(seconds) + float(microseconds) / MICROSECONDS_PER_S
        return ServerView(f"explored-{self.server_epoch}", now_s, self.clock.now_s - self.server_up_since_s)

    def take_snapshot(self, *, keep: int) -> None:
        """Redis as it is now, kept as one of the `keep` most recent states it could roll back to."""
        self.snapshots.append(Snapshot(RedisSnapshot.take(self.admin), self.action, self.time_passed_s))
        del self.snapshots[:-keep]

    def roll_back(self, snapshot: Snapshot) -> None:
        """Redis comes back as it was at the snapshot (power loss with everysec, a lagging replica):
        its clock went on meanwhile, and every process keeps what it believes."""
        snapshot.taken.restore(self.admin)
        self._age_redis(self.time_passed_s - snapshot.time_passed_s)
        # it is another Redis server now (restarted, or the replica promoted): every subscription is gone,
        # and every seat's stamp of life was written on a server that is not this one
        self.unsubscribe()
        self.server_epoch += 1
        self.server_up_since_s = self.clock.now_s
        # a snapshot is taken before its action runs: what that action did is lost with the rest
        self.gone_leases = {o: at for o, at in self.gone_leases.items() if at < snapshot.at_action}
        self.snapshots = [s for s in self.snapshots if s.at_action < snapshot.at_action]

    def push_malformed(self) -> bool:
        """A node's password (or a buggy producer) pushes an item that is not one of draftgen's messages."""
        item = self.rng.choice(malformed_items(real_generate_item()))
        self.admin.lpush(self.rng.choice(GENERATE_LISTS), item)
        return True

    def forge_a_record(self) -> bool:
        """A node's password writes the hand-over keys directly (HSETNX on staged, ZADD on its index, as its
        ACL allows): bytes that are no record, another prompt's completion, or one of an id never enqueued."""
        keys = RunKeys(RUN)
        under, other = self.rng.sample([one.id for one in self.prompts], 2)  # a record of its own id, whole,
        field, blob = self.rng.choice(  # is a lie no reader can tell: a node may always write wrong answers
            [
                (under, b"\x28\xb5\x2f\xfd not a whole frame"),
                (under, encode_blob(completion(other))),
                ("never-enqueued", encode_blob(completion("never-enqueued"))),
            ]
        )
        if not self.admin.hsetnx(keys.staged, field, blob):
            return False
        self.forged.add(field)
        self.admin.zadd(keys.staged_index, {field: self.clock.now_s}, nx=True)
        return True

    def _a_waiting_message(self) -> tuple[str, bytes] | None:
        """A message waiting in the generate queue, with its list; None when none waits."""
        waiting = [(name, raw) for name in GENERATE_LISTS for raw in self.admin.lrange(name, 0, -1)]
        return self.rng.choice(waiting) if waiting else None

    def duplicate_a_message(self) -> bool:
        if (picked := self._a_waiting_message()) is None:
            return False
        self.admin.lpush(*picked)
        return True

    def delay_a_message_for_years(self) -> bool:
        """A node's password rewrites a waiting message to run years from now (Celery would hold it, and its
        batch's message with it, until then)."""
        picked = self._a_waiting_message()
        if picked is None or why_malformed(picked[1], GENERATE_QUEUE, now_s=self.clock.now_s) is not None:
            return False
        name, raw = picked
        message = json.loads(raw)
        far = datetime.fromtimestamp(self.clock.now_s + FAR_FUTURE_S, UTC).isoformat()
        message["headers"]["eta"] = far
        with self.admin.pipeline(transaction=True) as pipe:
            pipe.lrem(name, 1, raw)
            pipe.lpush(name, json.dumps(message))
            pipe.execute()
        return True

    def lose_a_message(self) -> bool:
        if (picked := self._a_waiting_message()) is None:
            return False
        name, raw = picked
        self.admin.lrem(name, 1, raw)
        return True

    def restore_unacked(self) -> int:
        """The visibility timeout passes: kombu puts every unacknowledged message back in the queue."""
        entries = self.admin.hgetall(KOMBU_UNACKED_KEY)
        with self.admin.pipeline(transaction=True) as pipe:
            for tag, value in sorted(entries.items()):
                message = json.loads(value)[0]  # back to the list of its priority, as kombu restores it
                pipe.rpush(generate_list(message["properties"]["priority"]), json.dumps(message))
                pipe.hdel(KOMBU_UNACKED_KEY, tag)
                pipe.zrem(KOMBU_UNACKED_INDEX_KEY, tag)
            pipe.execute()
        return len(entries)
