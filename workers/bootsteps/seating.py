"""Seating a generate worker on its GPU before it takes any work (see workers/recovery/seat.py).

Run from Celery's `worker_init` signal, once the worker knows its queues and before any consumer starts:
a worker consuming the generate queue takes its GPU label's seat, then takes back at once the leases a
dead predecessor held under that label (a worker restarted after a SIGKILL or an OOM kill finds its own
batches again in seconds, not when their leases run out), recording the death against their prompts first
(workers/generate/deaths.py). A seat held by a live process stops this
worker before it takes anything: it exits with EXIT_SEAT_HELD and says which label and why. A seat its
Redis user may not hold (another GPU node's user, or a label whose host is not the one its user was made
for) stops it too, with EXIT_SEAT_REFUSED, which systemd does not restart: no restart can mend it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import redis

from workers.context import WorkerContext
from workers.errors import FunctionsMissing, SeatHeld, SeatRefused
from workers.generate.deaths import record_deaths
from workers.recovery.reconciler import Reconciler
from workers.recovery.seat import TakenSeat
from workers.state.dispatch import Dispatcher

log = logging.getLogger(__name__)

EXIT_SEAT_HELD = 3  # not 0 (systemd and honcho must see it failed), not 1 (Celery's own errors)
EXIT_SEAT_REFUSED = os.EX_NOPERM  # 77: RestartPreventExitStatus of deploy/systemd/draftgen-generate@.service
NODE_ENV_FILE = "/etc/draftgen/redis-worker-{host}.env"  # deploy/redis-credentials.sh --gpu-node <host>


def seat_generate_worker(context: WorkerContext, dispatcher: Dispatcher) -> None:
    """Take the seat and what its dead holder held; SystemExit(EXIT_SEAT_HELD) when a live one holds it."""
    try:
        taken = context.seat.take()
    except SeatHeld as error:
        log.error("this worker does not start: %s", error)
        raise SystemExit(EXIT_SEAT_HELD) from error
    except SeatRefused as error:
        log.error("this worker does not start: %s", seat_refused_reason(context, error))
        raise SystemExit(EXIT_SEAT_REFUSED) from error
    reconciler = Reconciler(context.redis, dispatcher, context.settings.reconcile_settings())
    taken_back = take_back_after_death(context.redis, reconciler, taken, context.seat.label)
    log.info(
        "seated on %s%s; %d batches of its predecessor taken back",
        context.seat.label,
        f" after {taken.previous[:8]}" if taken.previous else "",
        taken_back,
    )


def take_back_after_death(
    client: redis.Redis,
    reconciler: Reconciler,
    taken: TakenSeat,
    label: str,
    *,
    clock: Callable[[], float] = time.time,
) -> int:
    """Take back what the seat's dead holders held, recording their death against its prompts first
    (workers/generate/deaths.py); how many batches. With the functions missing, its predecessor's leases
    run out as any do."""
    try:
        return reconciler.take_back_seat(
            taken,
            label,
            before_dispatch=lambda run, batches: record_deaths(
                client, run, batches, label=label, clock=clock
            ),
        )
    except FunctionsMissing as error:
        log.warning("could not take back the batches of %s's predecessor: %s", label, error)
        return 0


def seat_refused_reason(context: WorkerContext, error: SeatRefused) -> str:
    """One line: which user was refused which label, and which env file that host's workers need."""
    host = context.settings.hostname
    user = urlsplit(context.settings.redis_url).username or "default"
    return (
        f"{error}: Redis user {user!r} may hold only the seats of its own GPU node; a worker labelled "
        f"{host!r} logs in with that host's user, from {NODE_ENV_FILE.format(host=host)} "
        f"(deploy/redis-credentials.sh --gpu-node {host}), or set DRAFTGEN_HOSTNAME to its user's host"
    )
