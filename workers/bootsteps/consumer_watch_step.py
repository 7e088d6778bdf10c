"""The Celery consumer bootstep that runs a generate worker's consumer watch (recovery/consumer_watch.py).

Like the liveness step, it starts once with the task consumer and lives as long as the process: a
consumer restart after a broker reconnect keeps it, which is the moment it is for.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from workers.context import WorkerContext
from workers.recovery.consumer_watch import ConsumerWatch, stop_celery_worker
from workers.state.ledger import gpu_label
from workers.state.queues import GENERATE_QUEUE


def held_requests(ctx: WorkerContext) -> int:
    from celery.worker import state  # the edge: what this worker's consumer has received and not finished

    return len(state.reserved_requests) + ctx.engine.in_flight


class ConsumerWatchStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    name = "draftgen.consumer_watch"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.watch: ConsumerWatch | None = None
        self._decided = False

    def start(self, parent: Any) -> None:
        if self._decided:  # a consumer restart: the watch, if any, is still running
            return
        self._decided = True
        if GENERATE_QUEUE not in {queue.name for queue in parent.task_consumer.queues}:
            return
        ctx: WorkerContext = parent.app.draftgen.get()
        self.watch = ConsumerWatch(
            ctx.redis,
            gpu_label(ctx.origin),
            held=lambda: held_requests(ctx),
            taking=lambda: not ctx.engine.suspended,
            stop_worker=stop_celery_worker,
            limit_s=ctx.settings.not_consuming_limit_s,
        ).start()

    def stop(self, parent: Any) -> None:
        """Called on consumer restarts as well as on shutdown: the watch keeps running."""

    def shutdown(self, parent: Any) -> None:
        if self.watch is not None:
            self.watch.stop()
