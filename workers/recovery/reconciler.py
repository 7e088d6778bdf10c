"""Reconciliation: nothing the run holds may wait for a message that will never come.

One pass, for every run:
1. Leases that ran out (their worker died, froze or lost its host) are taken back and their batches
   dispatched again; the dead worker's unacknowledged message is dropped from kombu's hash.
2. Open batches that nobody leases, whose dispatch is older than a grace period and that are not
   waiting in the generate queue, are dispatched again. This finds a batch whose message was lost
   whatever lost it: a Redis restart between kombu's pop and its unacked bookkeeping, a task acked
   on failure while Redis was away, a retry whose publish failed. The queue is read only while it is
   short (`max_scanned_messages`); while it is long such a batch waits for it to shorten, long before
   the run ends.
3. Staged completions and dead letters older than the upload age, or left once nothing else remains,
   get a flush message: the uploader commits without waiting for a batch to finish.

Every generate and upload worker runs passes (workers/bootsteps/reconciler_step.py); a Redis key lets one pass
run per interval across the fleet. Dispatching twice is harmless: the lease of the first delivery
sends the second away.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import redis

from workers.broker.kombu_layout import (
    drop_unacked_of_batches,
    reserved_generate_batches,
    waiting_generate_batches,
)
from workers.periodic import PeriodicThread
from workers.recovery.leases import LeaseHolder, decode_holder
from workers.recovery.seat import TakenSeat
from workers.state.dispatch import Dispatcher
from workers.state.keys import KEY_PREFIX, RUNS_KEY, RunKeys
from workers.state.protocol import Scripts
from workers.state.redis_client import redis_now_s

log = logging.getLogger(__name__)

DEFAULT_RECONCILE_INTERVAL_S = 15.0
# A batch dispatched this recently may be on its way into a worker that has not leased it yet.
DEFAULT_STRANDED_GRACE_S = 60.0
DEFAULT_MAX_SCANNED_MESSAGES = 5_000  # about 160,000 prompts of 32: a few MB to read
RECONCILER_LOCK_KEY = f"{KEY_PREFIX}:reconciler"
MS_PER_S = 1000


@dataclass(frozen=True)
class ReconcileSettings:
    upload_max_age_s: float  # the uploader's: staged work older than this is flushed
    interval_s: float = DEFAULT_RECONCILE_INTERVAL_S
    stranded_grace_s: float = DEFAULT_STRANDED_GRACE_S
    max_scanned_messages: int = DEFAULT_MAX_SCANNED_MESSAGES


@dataclass
class ReconcileReport:
    expired_leases: int = 0
    stranded: int = 0
    stale_messages_dropped: int = 0
    flushes: int = 0
    queue_scanned: bool = False

    def add(self, other: ReconcileReport) -> None:
        self.expired_leases += other.expired_leases
        self.stranded += other.stranded
        self.stale_messages_dropped += other.stale_messages_dropped
        self.flushes += other.flushes
        self.queue_scanned = self.queue_scanned or other.queue_scanned

    @property
    def acted(self) -> bool:
        """Whether a batch had to be dispatched again (a routine flush does not count)."""
        return bool(self.expired_leases or self.stranded)


@dataclass(frozen=True)
class TakenBack:
    """A batch whose lease was taken back, and who held it (None when its holder record was unreadable)."""

    batch_id: str
    holder: LeaseHolder | None


BeforeDispatch = Callable[[str, list[TakenBack]], object]
"""Called with a run and the batches taken back from its dead holders, before they are dispatched again."""


def _nothing_before(_run: str, _taken: list[TakenBack]) -> None: ...


class _WaitingQueue:
    """The generate queue's batches, read at most once per pass, and only when a pass needs them."""

    def __init__(self, client: redis.Redis, max_messages: int) -> None:
        self._client = client
        self._max_messages = max_messages
        self._read = False
        self._batches: set[tuple[str, str]] | None = None

    def batches(self) -> set[tuple[str, str]] | None:
        if not self._read:
            self._batches = waiting_generate_batches(self._client, max_messages=self._max_messages)
            self._read = True
        return self._batches


class Reconciler:
    def __init__(self, client: redis.Redis, dispatch: Dispatcher, settings: ReconcileSettings) -> None:
        self._client = client
        self._scripts = Scripts.register(client)
        self._dispatch = dispatch
        self._settings = settings

    def reconcile_all(self) -> ReconcileReport:
        report = ReconcileReport()
        waiting = _WaitingQueue(self._client, self._settings.max_scanned_messages)
        for raw in sorted(self._client.smembers(RUNS_KEY)):
            run = raw.decode()
            report.add(self._reconcile(run, waiting))
            report.flushes += self._flush_if_due(run)
        if report.acted:
            log.warning("reconciled: %s", report)
        elif report.flushes:
            log.info("reconciled: %s", report)
        return report

    def reconcile_run(self, run: str, *, dispatched_before_s: float) -> ReconcileReport:
        """One run only, with no grace period: `enqueue`, re-run, sends back now whatever an earlier
        enqueue or a lost worker left stranded.

        Only batches dispatched before `dispatched_before_s` (Redis time: when this enqueue began) are
        judged; the ones it published itself have their messages. A message goes from the queue to a
        worker's unacknowledged hash to a lease, so they are read in that order: one on its way is
        seen in one of them. (The periodic pass cannot tell a live worker's unacknowledged message
        from a dead one's; its grace period covers that moment instead.)"""
        waiting = _WaitingQueue(self._client, self._settings.max_scanned_messages)
        waiting.batches()
        reserved = reserved_generate_batches(self._client, run)
        return self._reconcile(
            run, waiting, carried_elsewhere=reserved, dispatched_before_s=dispatched_before_s
        )

    def _reconcile(
        self,
        run: str,
        waiting: _WaitingQueue,
        carried_elsewhere: frozenset[str] | set[str] = frozenset(),
        dispatched_before_s: float = math.inf,
    ) -> ReconcileReport:
        report = self._take_back_expired(run)
        candidates = [
            b for b in self._stranded_candidates(run, dispatched_before_s) if b not in carried_elsewhere
        ]
        if candidates:
            queued = waiting.batches()
            report.queue_scanned = queued is not None
            if queued is not None:
                report.stranded = self._redispatch(run, [b for b in candidates if (run, b) not in queued])
        return report

    def _take_back_expired(self, run: str) -> ReconcileReport:
        keys = RunKeys(run)
        flat = self._scripts.expire_leases(keys=[keys.open_batches, keys.leases, keys.lease_owners])
        return self._dispatch_taken_back(run, _taken_back(flat), "ran out")

    def take_back_seat(
        self, seat: TakenSeat, label: str, *, before_dispatch: BeforeDispatch = _nothing_before
    ) -> int:
        """A worker that took its label's seat from a dead process takes that process's leases back at
        once, in every run, instead of waiting for them to run out; `before_dispatch` is told of each
        run's batches first. Returns how many."""
        taken = 0
        for raw in sorted(self._client.smembers(RUNS_KEY)):
            run = raw.decode()
            keys = RunKeys(run)
            flat = self._scripts.take_back_seat_leases(
                keys=[keys.open_batches, keys.leases, keys.lease_owners], args=[label, seat.token]
            )
            batches = _taken_back(flat)
            if batches:
                before_dispatch(run, batches)
            taken += self._dispatch_taken_back(run, batches, "was held by a dead worker").expired_leases
        return taken

    def _dispatch_taken_back(self, run: str, taken_back: list[TakenBack], why: str) -> ReconcileReport:
        """Leases taken back: drop their dead holders' unacknowledged messages, then dispatch their batches
        again, before every batch not begun (their conversations under way resume before new ones start)."""
        report = ReconcileReport()
        report.stale_messages_dropped = drop_unacked_of_batches(
            self._client, run, (taken.batch_id for taken in taken_back)
        )
        for taken in taken_back:
            log.warning(
                "batch %s of run %s: the lease of %s %s; dispatching it again",
                taken.batch_id,
                run,
                taken.holder.worker if taken.holder else "an unknown worker",
                why,
            )
            self._dispatch.generate(run, taken.batch_id, resumed=True)
            report.expired_leases += 1
        return report

    def _stranded_candidates(self, run: str, dispatched_before_s: float) -> list[str]:
        """Open batches nobody leases whose last dispatch is older than the grace period (and than
        `dispatched_before_s`)."""
        keys = RunKeys(run)
        before = min(redis_now_s(self._client) - self._settings.stranded_grace_s, dispatched_before_s)
        ids = [raw.decode() for raw in self._client.zrangebyscore(keys.open_batches, "-inf", f"({before}")]
        if not ids:
            return []
        leased = self._client.zmscore(keys.leases, ids)
        return [batch_id for batch_id, expiry in zip(ids, leased, strict=True) if expiry is None]

    def _redispatch(self, run: str, batch_ids: list[str]) -> int:
        if not batch_ids:
            return 0
        keys = RunKeys(run)
        chosen = [
            raw.decode()
            for raw in self._scripts.redispatch(keys=[keys.open_batches, keys.leases], args=batch_ids)
        ]
        drop_unacked_of_batches(self._client, run, chosen)  # a dead worker's delayed retry, say
        for batch_id in chosen:
            log.warning("batch %s of run %s: in no queue, held by nobody; dispatched again", batch_id, run)
            self._dispatch.generate(run, batch_id)
        return len(chosen)

    def _flush_if_due(self, run: str) -> int:
        """A flush for completions or dead letters awaiting upload that are old, or that nothing else
        will flush: the last batch of a run may end in dead letters only."""
        keys = RunKeys(run)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.zrange(keys.staged_index, 0, 0, withscores=True)
            pipe.zrange(keys.dead_pending, 0, 0, withscores=True)
            oldest = [score for found in pipe.execute() for _member, score in found]
        if not oldest:
            return 0
        age_s = redis_now_s(self._client) - min(oldest)
        if age_s < self._settings.upload_max_age_s and not self._drained(keys):
            return 0
        self._dispatch.flush(run)
        return 1

    def _drained(self, keys: RunKeys) -> bool:
        """Nothing left to generate: every open batch is finished."""
        return int(self._client.zcard(keys.open_batches)) == 0


class ReconcilerLoop:
    """Runs a pass every interval on a daemon thread, when this process wins the fleet-wide turn."""

    def __init__(self, client: redis.Redis, reconciler: Reconciler, *, interval_s: float, name: str) -> None:
        self._client = client
        self._reconciler = reconciler
        self._interval_s = interval_s
        self._name = name
        self._thread = PeriodicThread("draftgen-reconciler", interval_s, self.turn)

    def turn(self) -> ReconcileReport | None:
        """One pass if no other process ran one this interval."""
        won = self._client.set(RECONCILER_LOCK_KEY, self._name, nx=True, px=int(self._interval_s * MS_PER_S))
        return self._reconciler.reconcile_all() if won else None

    def start(self) -> ReconcilerLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()


def _taken_back(flat: list[bytes]) -> list[TakenBack]:
    """The id, holder pairs a take-back function returns."""
    return [
        TakenBack(raw.decode(), decode_holder(holder) if holder else None)
        for raw, holder in zip(flat[::2], flat[1::2], strict=True)
    ]
