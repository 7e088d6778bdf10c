"""A generate worker that has stopped consuming says so, then exits to be restarted.

Celery's consumer can stay up and take nothing after a broker connection reset (celery/celery has
reports of it). Nothing else notices: the process is alive, its heartbeat beats, its GPU idles. A
healthy worker with a free slot takes a waiting message within milliseconds, so the watch asks, every
few seconds: are there messages waiting in the generate queue while this worker holds no request and
means to take work (its liveness watcher has not stopped it)? Once that has held for
`DRAFTGEN_NOT_CONSUMING_LIMIT_S` without a break, the worker holds nothing a restart could lose: it
logs why, leaves a note that `status` shows, and shuts down warm with `EXIT_NOT_CONSUMING`
(`os.EX_TEMPFAIL`, which `scripts/respawn` and systemd's `Restart=always` restart). If the warm
shutdown does not end the process within `EXIT_GRACE_S`, it exits hard: it held no batch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from workers.broker.kombu_layout import waiting_messages
from workers.periodic import PeriodicThread
from workers.state.exit_notes import leave_exit_note
from workers.state.queues import GENERATE_QUEUE

log = logging.getLogger(__name__)


DEFAULT_NOT_CONSUMING_LIMIT_S = 120.0  # a broker reconnect takes seconds; two idle minutes cost little
CHECK_INTERVAL_S = 5.0
WARN_AFTER_S = CHECK_INTERVAL_S
EXIT_NOT_CONSUMING = os.EX_TEMPFAIL  # 75: "try again", restarted by scripts/respawn and systemd
EXIT_GRACE_S = 60.0


@dataclass(frozen=True)
class ConsumerFigures:
    waiting: int | None  # messages waiting in the generate queue; None when Redis did not answer
    held: int  # requests this worker holds: received, running or in flight at its server
    taking: bool  # False while the worker stopped taking work on purpose (its server is hung)


class NotConsumingJudge:
    """How long, without a break, work has waited while this worker held nothing and meant to take it."""

    def __init__(self) -> None:
        self._since: float | None = None

    def observe(self, now: float, figures: ConsumerFigures) -> float | None:
        """Seconds not consuming so far, or None while the worker is consuming (or cannot be judged)."""
        idle_beside_work = figures.taking and figures.held == 0 and bool(figures.waiting)
        if not idle_beside_work:
            self._since = None
            return None
        if self._since is None:
            self._since = now
        return now - self._since


class ConsumerWatch:
    """Every `CHECK_INTERVAL_S`, judges whether the worker consumes; past the limit, ends it to restart."""

    def __init__(
        self,
        client: redis.Redis,
        worker: str,
        held: Callable[[], int],
        taking: Callable[[], bool],
        stop_worker: Callable[[int], None],
        *,
        limit_s: float = DEFAULT_NOT_CONSUMING_LIMIT_S,
        interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._worker = worker
        self._held = held
        self._taking = taking
        self._stop_worker = stop_worker
        self._limit_s = limit_s
        self._clock = clock
        self._judge = NotConsumingJudge()
        self._stopping = False
        self.not_consuming_s: float | None = None  # the heartbeat shows it
        self._thread = PeriodicThread("draftgen-consumer-watch", interval_s, self.check)

    def figures(self) -> ConsumerFigures:
        try:
            waiting: int | None = waiting_messages(self._client, GENERATE_QUEUE)
        except redis.RedisError:
            waiting = None  # Redis away: no worker can consume; not this one's fault
        return ConsumerFigures(waiting=waiting, held=self._held(), taking=self._taking())

    def check(self) -> None:
        if self._stopping:
            return
        figures = self.figures()
        self.not_consuming_s = self._judge.observe(self._clock(), figures)
        if self.not_consuming_s is None:
            return
        reason = (
            f"{self._worker} took no message for {self.not_consuming_s:.0f} s while {figures.waiting} "
            "waited in the generate queue and its GPU was idle"
        )
        if self.not_consuming_s < self._limit_s:
            if self.not_consuming_s >= WARN_AFTER_S:  # a healthy worker can be seen between two messages
                log.warning("consumer watch: %s (exits to be restarted at %.0f s)", reason, self._limit_s)
            return
        self._stopping = True
        log.error("consumer watch: %s; exiting with %d to be restarted", reason, EXIT_NOT_CONSUMING)
        self._leave_note(reason)
        self._stop_worker(EXIT_NOT_CONSUMING)

    def _leave_note(self, reason: str) -> None:
        try:
            leave_exit_note(self._client, self._worker, reason)
        except redis.RedisError:
            log.warning("consumer watch: could not leave the exit note for %s", self._worker)

    def start(self) -> ConsumerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()


def stop_celery_worker(exit_code: int, *, grace_s: float = EXIT_GRACE_S) -> None:
    """A warm shutdown with `exit_code`, as Celery's own SIGTERM handler asks for one; a hard exit if the
    consumer is too stuck to notice within `grace_s`."""
    from celery.worker import state  # the edge: Celery's process-wide shutdown flag

    state.should_stop = exit_code
    timer = threading.Timer(grace_s, os._exit, args=(exit_code,))
    timer.daemon = True
    timer.start()
