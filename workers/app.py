"""The Celery app: Redis as broker, late acks, JSON messages only, events on for Flower.

`make_app` builds it from `WorkerSettings`; `workers/__init__.py` does so from the `DRAFTGEN_*`
environment when `celery -A workers` imports it (the process edge). The app carries the holder of the
process's context (`app.draftgen`), which the tasks and the bootsteps are handed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, worker_init, worker_shutdown, worker_shutting_down

from workers.bootsteps.consumer_watch_step import ConsumerWatchStep
from workers.bootsteps.heartbeat_step import HeartbeatStep
from workers.bootsteps.liveness_step import LivenessStep
from workers.bootsteps.reconciler_step import ReconcilerStep
from workers.bootsteps.seating import seat_generate_worker
from workers.broker.broker import broker_config, new_app
from workers.context import ContextHolder, WorkerContext
from workers.control_commands import limit_remote_control
from workers.flower_guard import install_flower_guard
from workers.flower_queues import install_flower_queues
from workers.log_lines import one_line_for_recoverable_errors
from workers.settings import WorkerSettings
from workers.state.dispatch import CeleryDispatcher
from workers.state.queues import GENERATE_QUEUE
from workers.tasks import register_tasks


def celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """The broker's configuration (workers/broker/broker.py) and what a consuming worker adds to it."""
    return {
        **broker_config(settings.broker),
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # Several batches per worker share one in-flight window (see workers/generate/generation.py).
        "worker_pool": "threads",
        "worker_concurrency": settings.batches_in_flight,
    }


def make_app(
    settings: WorkerSettings, context_factory: Callable[[WorkerSettings], WorkerContext] = WorkerContext
) -> Celery:
    app = new_app(settings.broker)
    app.conf.update(celery_config(settings))
    contexts = ContextHolder(settings, context_factory, CeleryDispatcher(app))
    app.draftgen = contexts
    register_tasks(app, contexts)
    app.steps["consumer"].add(HeartbeatStep)
    app.steps["consumer"].add(LivenessStep)  # generate workers watch their server's token progress
    app.steps["consumer"].add(ConsumerWatchStep)  # a generate worker that stops consuming exits to restart
    app.steps["consumer"].add(ReconcilerStep)  # every worker takes its turn at reconciliation

    def begin_shutdown(**_: object) -> None:
        context = contexts.built()
        if context is not None:
            context.begin_shutdown()

    def close_context(**_: object) -> None:
        contexts.close()

    def guard_remote_control(**_: object) -> None:
        if not settings.remote_control_commands:
            limit_remote_control()

    def take_gpu_seat(sender: Any, **_: object) -> None:
        """Before any consumer starts: a generate worker seats itself on its GPU (bootsteps/seating.py)."""
        if GENERATE_QUEUE in sender.app.amqp.queues.consume_from:
            seat_generate_worker(contexts.get(), CeleryDispatcher(app))

    def one_line_logs(logger: logging.Logger, **_: object) -> None:
        one_line_for_recoverable_errors(logger)

    after_setup_logger.connect(one_line_logs, weak=False)  # a Redis restart: a line per event, no traceback
    worker_init.connect(guard_remote_control, weak=False)  # in a worker process, before it consumes
    worker_init.connect(take_gpu_seat, weak=False)
    worker_shutting_down.connect(begin_shutdown, weak=False)
    worker_shutdown.connect(close_context, weak=False)
    install_flower_guard(app)  # only under `celery -A workers flower`: Flower's login check
    install_flower_queues(app)  # and its Broker page lists both queues
    return app
