"""The Celery bootstep that seats a generate worker on its GPU before it takes work (see workers/seat.py).

At the first consumer start of a worker consuming the generate queue: take the GPU label's seat, then
take back at once the leases a dead predecessor held under that label (a worker restarted after a
SIGKILL or an OOM kill finds its own batches again in seconds, not when their leases run out). A
seat held by a live process stops this worker before it takes anything: it exits with EXIT_SEAT_HELD
and says which label and why. A seat lost later (another worker took it while this one was cut off
from Redis) stops the worker as SIGTERM does: its batches go back.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from workers.dispatch import CeleryDispatcher
from workers.errors import SeatHeld
from workers.queues import GENERATE_QUEUE
from workers.reconciler import Reconciler

log = logging.getLogger(__name__)

EXIT_SEAT_HELD = 3  # not 0 (systemd and honcho must see it failed), not 1 (Celery's own errors)


class SeatStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery's bootsteps are untyped
    name = "draftgen.seat"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._seated = False

    def start(self, parent: Any) -> None:
        if self._seated or GENERATE_QUEUE not in parent.app.amqp.queues.consume_from:
            return
        context = parent.app.draftgen.get()
        try:
            taken = context.seat.take()
        except SeatHeld as error:
            log.error("this worker does not start: %s", error)
            raise SystemExit(EXIT_SEAT_HELD) from error
        self._seated = True
        reconciler = Reconciler(
            context.redis, CeleryDispatcher(parent.app), context.settings.reconcile_settings()
        )
        taken_back = reconciler.take_back_seat(taken, context.seat.label)
        log.info(
            "seated on %s%s; %d batches of its predecessor taken back",
            context.seat.label,
            f" after {taken.previous[:8]}" if taken.previous else "",
            taken_back,
        )
