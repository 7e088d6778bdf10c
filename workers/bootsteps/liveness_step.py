"""The Celery consumer bootstep that runs a `LivenessWatcher` in every worker consuming the generate queue.

It starts once the task consumer exists, and only in a worker started with `-Q generate` and
`DRAFTGEN_LIVENESS_ENABLED` on. The watcher lives as long as the process: a consumer restart (after a
broker connection loss) keeps it, and with it whether the queue is cancelled; worker shutdown ends it.
Queue changes go through `Consumer.call_soon`, as Celery's own `cancel_consumer` and `add_consumer`
remote-control commands do, so they run on the consumer's event loop, not on the watcher's thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import bootsteps

from workers.settings import WorkerSettings
from workers.state.queues import GENERATE_QUEUE

if TYPE_CHECKING:
    from workers.generate.liveness import LivenessWatcher

log = logging.getLogger(__name__)


class ConsumerQueueSwitch:
    """Stops and restarts a Celery consumer taking messages from one queue."""

    def __init__(self, consumer: Any, queue: str) -> None:
        self._consumer = consumer
        self._queue = queue

    def stop_taking(self) -> None:
        self._consumer.call_soon(self._consumer.cancel_task_queue, self._queue)

    def resume_taking(self) -> None:
        self._consumer.call_soon(self._consumer.add_task_queue, self._queue)


class LivenessStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Starts the liveness watcher of a generate worker's server (see workers/generate/liveness.py)."""

    name = "draftgen.liveness"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.watcher: LivenessWatcher | None = None
        self._decided = False

    def start(self, parent: Any) -> None:
        if self._decided:  # a consumer restart: the watcher, if any, is still running
            return
        self._decided = True
        # Imported here: only generate workers need the watcher.
        from workers.generate.liveness import LivenessWatcher

        context = parent.app.draftgen.get()
        settings: WorkerSettings = context.settings
        consumed = {queue.name for queue in parent.task_consumer.queues}
        if GENERATE_QUEUE not in consumed:
            return
        if not settings.liveness_enabled:
            log.warning("liveness: disabled by DRAFTGEN_LIVENESS_ENABLED; a hung server goes unnoticed")
            return
        self.watcher = LivenessWatcher(
            context.engine, ConsumerQueueSwitch(parent, GENERATE_QUEUE), settings
        ).start()

    def stop(self, parent: Any) -> None:
        """Called on consumer restarts as well as on shutdown: the watcher keeps running."""

    def shutdown(self, parent: Any) -> None:
        if self.watcher is not None:
            self.watcher.stop()
