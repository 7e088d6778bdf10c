"""The Celery bootstep that runs a generate worker's heartbeat (see workers/generate/heartbeat.py).

A consumer step: it starts once the worker consumes, and only on workers that consume the
generate queue (an uploader has no GPU to report).
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from inference.server_probe import ServerProbe
from workers.context import WorkerContext
from workers.generate.heartbeat import EngineFigures, HeartbeatPublisher, WorkerIdentity
from workers.state.ledger import gpu_label
from workers.state.queues import GENERATE_QUEUE


def consumes_generate_queue(consumer: Any) -> bool:
    return GENERATE_QUEUE in consumer.app.amqp.queues.consume_from


class HeartbeatStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery's bootsteps are untyped
    """Starts the heartbeat thread with the consumer and stops it (removing the key) on shutdown."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.publisher: HeartbeatPublisher | None = None

    def start(self, parent: Any) -> None:
        if not consumes_generate_queue(parent):
            return
        if self.publisher is None:
            self.publisher = build_publisher(parent.app.draftgen.get())
        self.publisher.start()

    def stop(self, parent: Any) -> None:
        if self.publisher is not None:
            self.publisher.stop()

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)


def build_publisher(ctx: WorkerContext) -> HeartbeatPublisher:
    """A publisher over the process's worker context (the engine is the one the tasks use)."""
    settings = ctx.settings
    identity = WorkerIdentity(
        worker=gpu_label(ctx.origin),
        host=settings.hostname,
        gpu=settings.gpu,
        server_url=settings.server_url,
        max_in_flight=settings.max_in_flight,
    )

    def engine_figures() -> EngineFigures:
        engine = ctx.engine
        return EngineFigures(in_flight=engine.in_flight, suspended=engine.suspended)

    return HeartbeatPublisher(
        ctx.redis, identity, ServerProbe(settings.server_url, settings.api_key), engine_figures
    )
