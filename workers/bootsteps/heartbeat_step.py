"""The Celery bootstep that runs a generate worker's heartbeat (see workers/generate/heartbeat.py), and
what the worker tells Flower.

A consumer step: it starts once the worker consumes, and only on workers that consume the
generate queue (an uploader has no GPU to report). It starts after Celery's event dispatcher, which it
hands to the batches' life events (workers/generate/batch_life.py) each time the consumer (re)starts;
and its `info` joins `celery inspect stats`, which Flower's worker page shows under "Other": the GPU's
output over the last minute, its batches and its server's state.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from inference.server_probe import ServerProbe
from workers.context import WorkerContext
from workers.generate.heartbeat import EngineFigures, HeartbeatPublisher, WorkerIdentity
from workers.state.heartbeats import WorkerHeartbeat
from workers.state.ledger import gpu_label
from workers.state.queues import GENERATE_QUEUE


def consumes_generate_queue(consumer: Any) -> bool:
    return GENERATE_QUEUE in consumer.app.amqp.queues.consume_from


class HeartbeatStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery's bootsteps are untyped
    """Starts the heartbeat thread with the consumer and stops it (removing the key) on shutdown."""

    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.publisher: HeartbeatPublisher | None = None
        self.context: WorkerContext | None = None

    def start(self, parent: Any) -> None:
        if not consumes_generate_queue(parent):
            return
        self.context = parent.app.draftgen.get()
        self.context.batch_life.attach(parent.event_dispatcher)
        if self.publisher is None:
            self.publisher = build_publisher(self.context)
        self.publisher.start()

    def stop(self, parent: Any) -> None:
        if self.context is not None:
            self.context.batch_life.attach(None)  # Celery closes this dispatcher; a restart brings another
        if self.publisher is not None:
            self.publisher.stop()

    def info(self, parent: Any) -> dict[str, Any]:
        """What Flower's worker page shows of this GPU (`celery inspect stats`): a row a figure, each
        named `draftgen_<figure>`."""
        if self.context is None or self.publisher is None:
            return {}
        figures = gpu_figures(self.context, self.publisher.last_beat)
        return {f"{STATS_PREFIX}{name}": value for name, value in figures.items()}

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)


STATS_PREFIX = "draftgen_"
ACCEPT_LENGTH_DECIMALS = 2
COMPLETIONS_PER_MINUTE_DECIMALS = 1


def accept_length(beat: WorkerHeartbeat | None) -> float | None:
    if beat is None or beat.spec_accept_length is None:
        return None
    return round(beat.spec_accept_length, ACCEPT_LENGTH_DECIMALS)


def gpu_figures(ctx: WorkerContext, beat: WorkerHeartbeat | None) -> dict[str, Any]:
    """The GPU's output over the last minute (as `producer status` counts it), its batches and its server."""
    engine = ctx.engine
    rates = engine.recent_output.rates()
    return {
        "gpu": gpu_label(ctx.origin),
        "server": ctx.settings.server_url,
        "server_health": "not probed yet" if beat is None else beat.server_health,
        "suspended": engine.suspended_because or "no",
        "output_tokens_per_s": round(rates.output_tokens_per_s),
        "completions_per_minute": round(rates.completions_per_minute, COMPLETIONS_PER_MINUTE_DECIMALS),
        "over_last_s": round(rates.window_s),
        "requests_in_flight": f"{engine.in_flight}/{ctx.settings.max_in_flight}",
        "batches_held": ctx.batch_life.in_flight(),
        "spec_accept_length": accept_length(beat),
    }


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
        trials = engine.trial_settings
        return EngineFigures(
            in_flight=engine.in_flight,
            suspended=engine.suspended,
            trials=engine.trial_plans(),
            trial_within_s=trials.silence_limit_s,
            timing_floor_s=trials.timing_floor_s,
        )

    return HeartbeatPublisher(
        ctx.redis, identity, ServerProbe(settings.server_url, settings.api_key), engine_figures
    )
