"""Seating a generate worker on its GPU before it takes any work (see workers/recovery/seat.py).

Run from Celery's `worker_init` signal, once the worker knows its queues and before any consumer starts:
a worker consuming the generate queue takes its GPU label's seat, then takes back at once the leases a
dead predecessor held under that label (a worker restarted after a SIGKILL or an OOM kill finds its own
batches again in seconds, not when their leases run out). A seat held by a live process stops this
worker before it takes anything: it exits with EXIT_SEAT_HELD and says which label and why.
"""

from __future__ import annotations

import logging

from workers.context import WorkerContext
from workers.errors import FunctionsMissing, SeatHeld
from workers.recovery.reconciler import Reconciler
from workers.state.dispatch import Dispatcher

log = logging.getLogger(__name__)

EXIT_SEAT_HELD = 3  # not 0 (systemd and honcho must see it failed), not 1 (Celery's own errors)


def seat_generate_worker(context: WorkerContext, dispatcher: Dispatcher) -> None:
    """Take the seat and what its dead holder held; SystemExit(EXIT_SEAT_HELD) when a live one holds it."""
    try:
        taken = context.seat.take()
    except SeatHeld as error:
        log.error("this worker does not start: %s", error)
        raise SystemExit(EXIT_SEAT_HELD) from error
    reconciler = Reconciler(context.redis, dispatcher, context.settings.reconcile_settings())
    try:
        taken_back = reconciler.take_back_seat(taken, context.seat.label)
    except FunctionsMissing as error:  # its predecessor's leases run out as any do
        log.warning("could not take back the batches of %s's predecessor: %s", context.seat.label, error)
        taken_back = 0
    log.info(
        "seated on %s%s; %d batches of its predecessor taken back",
        context.seat.label,
        f" after {taken.previous[:8]}" if taken.previous else "",
        taken_back,
    )
