"""Batch leases: which task execution generates a batch, renewed while it does, taken back once it stops.

Celery on Redis redelivers an unacknowledged message only after its visibility timeout (2 h by
default), and a restarted worker does not reclaim its predecessor's messages early. So draftgen does
not wait for it: a generate task takes a lease on its batch in Redis (`leases`, `lease_owners`),
a `LeaseKeeper` thread renews every lease the process holds every `renew_s`, and a lease that is not
renewed for `ttl_s` (the process was SIGKILLed, lost its host, or froze) is taken back by the
reconciler (workers/recovery/reconciler.py), which dispatches the batch again. The visibility timeout stays a
backstop: the old message, when it comes back hours later, finds its batch finished or leased and is
acknowledged without work.

A lease also keeps two deliveries of one batch (a republished message, a restored one) from
generating it twice: the second finds the first's live lease and is acknowledged at once. A holder
that froze past its lease (SIGSTOP, a long GC pause) learns on its next renewal that another
execution took over, and stops sending that batch's requests; until that renewal it already sends
none, because it judges its lease by its own monotonic clock.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
import redis

from core.records import Record
from workers.errors import FunctionsMissing, RecordUnreadable
from workers.periodic import PeriodicThread
from workers.state.codec import decode_json
from workers.state.keys import RunKeys
from workers.state.protocol import Scripts
from workers.state.record_limits import SMALL_RECORD_LIMIT_BYTES

log = logging.getLogger(__name__)

# A lease outlives several missed renewals (a Redis restart, a slow beat) yet brings a lost worker's
# batches back well within the 2 minutes the design promises: ttl + one reconcile interval.
DEFAULT_LEASE_TTL_S = 60.0
DEFAULT_LEASE_RENEW_S = 10.0


class Acquired(enum.StrEnum):
    ACQUIRED = "acquired"  # this execution generates the batch
    HELD = "held"  # another execution's lease is live: it generates the batch
    FINISHED = "finished"  # the batch is done: nothing to generate


class LeaseHolder(Record, frozen=True):
    """Who holds a lease: the execution's token, the worker it runs in (its GPU label), and that worker
    process's seat (recovery/seat.py: a restarted worker takes back the leases of its label's dead seats)."""

    owner: str
    worker: str
    seat: str = ""


def decode_holder(raw: bytes | str) -> LeaseHolder | None:
    try:
        return decode_json(raw, LeaseHolder, limit_bytes=SMALL_RECORD_LIMIT_BYTES)
    except RecordUnreadable:
        return None


@dataclass(frozen=True)
class Lease:
    run: str
    batch_id: str
    holder: LeaseHolder


@dataclass
class _Tracked:
    valid_until: float  # monotonic seconds
    lost: bool = False


class LeaseKeeper:
    """Takes, renews, and gives back the leases of one worker process's batches."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        worker: str,
        seat: str = "",
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        renew_s: float = DEFAULT_LEASE_RENEW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._scripts = Scripts.register(client)
        self._worker = worker
        self._seat = seat
        self._ttl_s = ttl_s
        self._clock = clock
        self._held: dict[Lease, _Tracked] = {}
        self._releases_due: dict[Lease, float] = {}  # hand-backs Redis could not take yet: lease -> delay s
        self._lock = threading.Lock()
        self._renewer = PeriodicThread("draftgen-leases", renew_s, self.renew)

    # ------------------------------------------------------------------ one batch

    def acquire(self, run: str, batch_id: str) -> tuple[Acquired, Lease]:
        keys = RunKeys(run)
        holder = LeaseHolder(owner=uuid.uuid4().hex, worker=self._worker, seat=self._seat)
        lease = Lease(run, batch_id, holder)
        started = self._clock()
        result = self._scripts.acquire_lease(
            keys=[keys.batch(batch_id), keys.open_batches, keys.leases, keys.lease_owners],
            args=[batch_id, msgspec.json.encode(lease.holder), lease.holder.owner, self._ttl_s],
        )
        outcome = Acquired(result.decode() if isinstance(result, bytes) else result)
        if outcome is Acquired.ACQUIRED:
            with self._lock:
                self._held[lease] = _Tracked(valid_until=started + self._ttl_s)
        return outcome, lease

    def held(self, lease: Lease) -> bool:
        """Whether this execution may still send the batch's requests (cheap: no Redis call)."""
        with self._lock:
            tracked = self._held.get(lease)
            return tracked is not None and not tracked.lost and self._clock() < tracked.valid_until

    def release(self, lease: Lease, *, delay_s: float) -> bool:
        """Hand the batch back unfinished; its retry comes in `delay_s`. False when another execution
        holds it now (then the batch is that one's, and this message is simply acknowledged).
        When Redis cannot take the hand-back (away, or without the protocol's functions), the renewal
        thread makes it once Redis can, and the error is raised: the lease is never renewed again."""
        self._forget(lease)
        try:
            return self._release_in_redis(lease, delay_s)
        except (redis.RedisError, FunctionsMissing):
            with self._lock:
                self._releases_due[lease] = delay_s
            raise

    def release_soon(self, lease: Lease, *, delay_s: float) -> None:
        """Hand the batch back now, or, while Redis cannot take it, from the renewal thread once it can:
        the batch's retry then finds it free rather than leased by this ended execution."""
        with contextlib.suppress(redis.RedisError, FunctionsMissing):
            self.release(lease, delay_s=delay_s)

    def release_if_held(self, lease: Lease, *, delay_s: float) -> None:
        """Hand the batch back unless this execution already gave its lease up (handed back, finished or
        abandoned): what every path that leaves a batch unfinished calls, whatever ended it."""
        with self._lock:
            held = lease in self._held
        if held:
            self.release_soon(lease, delay_s=delay_s)

    def _release_in_redis(self, lease: Lease, delay_s: float) -> bool:
        keys = RunKeys(lease.run)
        return bool(
            self._scripts.release_lease(
                keys=[keys.open_batches, keys.leases, keys.lease_owners],
                args=[lease.batch_id, lease.holder.owner, delay_s],
            )
        )

    def finish(self, lease: Lease, prompt_ids: Sequence[str]) -> list[str]:
        """Every prompt is handed over: the batch and its lease go. Returns the prompts Redis does not
        hold as handed over (it lost its last writes): then nothing went, and the batch is to be
        handed back."""
        unsettled = finish_batch(self._client, lease.run, lease.batch_id, prompt_ids, self._scripts)
        if not unsettled:
            self._forget(lease)
        return unsettled

    def abandon(self, lease: Lease) -> None:
        """Stop renewing without a word to Redis: the lease runs out and the reconciler takes it back."""
        self._forget(lease)

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease, None)

    # ------------------------------------------------------------------ renewing

    def renew(self) -> list[Lease]:
        """Renew every lease held; returns those found lost (another execution took the batch).
        First hands back what could not be handed back while Redis was away."""
        with self._lock:
            due = list(self._releases_due.items())
        for lease, delay_s in due:
            self._release_in_redis(lease, delay_s)
            with self._lock:
                self._releases_due.pop(lease, None)
        with self._lock:
            by_run: dict[str, list[Lease]] = defaultdict(list)
            for lease, tracked in self._held.items():
                if not tracked.lost:
                    by_run[lease.run].append(lease)
        lost: list[Lease] = []
        for run, leases in by_run.items():
            started = self._clock()
            keys = RunKeys(run)
            args: list[str | bytes | float] = [self._ttl_s]
            for lease in leases:
                args += [lease.batch_id, lease.holder.owner, msgspec.json.encode(lease.holder)]
            lost_ids = {
                raw.decode()
                for raw in self._scripts.renew_leases(
                    keys=[keys.leases, keys.lease_owners, *(keys.batch(lease.batch_id) for lease in leases)],
                    args=args,
                )
            }
            with self._lock:
                for lease in leases:
                    still = self._held.get(lease)
                    if still is None:
                        continue
                    if lease.batch_id in lost_ids:
                        still.lost = True
                        lost.append(lease)
                    else:
                        still.valid_until = started + self._ttl_s
        for lease in lost:
            log.warning("batch %s of run %s was taken over; its requests stop", lease.batch_id, lease.run)
        return lost

    def start(self) -> LeaseKeeper:
        self._renewer.start()
        return self

    def stop(self) -> None:
        self._renewer.stop()


def finish_batch(
    client: redis.Redis,
    run: str,
    batch_id: str,
    prompt_ids: Sequence[str],
    scripts: Scripts | None = None,
) -> list[str]:
    """The batch is done (or given up): its lease, place among open batches and failures go, and its body
    is kept finished until its prompts are committed, once Redis holds every one of `prompt_ids` as
    staged, committed or dead. Returns those it does not (and then changes nothing)."""
    keys = RunKeys(run)
    unsettled = (scripts or Scripts.register(client)).finish_batch(
        keys=[
            keys.batch(batch_id),
            keys.open_batches,
            keys.leases,
            keys.lease_owners,
            keys.batch_failures,
            keys.done,
            keys.staged,
            keys.dead,
            keys.finished_batch(batch_id),
            keys.finished_batches,
            keys.finished_prompts,
        ],
        args=[batch_id, *prompt_ids],
    )
    return [raw.decode() for raw in unsettled]


def defer_batch(client: redis.Redis, run: str, batch_id: str, delay_s: float) -> bool:
    """A batch handed back before it was leased (run paused, backlog): the reconciler leaves it alone
    while its retry waits. False when another execution holds it."""
    keys = RunKeys(run)
    return bool(
        Scripts.register(client).release_lease(
            keys=[keys.open_batches, keys.leases, keys.lease_owners], args=[batch_id, "", delay_s]
        )
    )
