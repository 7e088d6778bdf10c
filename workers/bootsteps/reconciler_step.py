"""The Celery consumer bootstep that gives every worker (generate and upload) its turn at reconciliation.

Each worker runs a `ReconcilerLoop`; a Redis key lets one pass run per interval across the fleet, so
the reconciler lives as long as any worker does.
"""

from __future__ import annotations

import os
from typing import Any

from celery import bootsteps

from workers.recovery.reconciler import Reconciler, ReconcilerLoop
from workers.state.dispatch import CeleryDispatcher


class ReconcilerStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery's bootsteps are untyped
    name = "draftgen.reconciler"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.loop: ReconcilerLoop | None = None

    def start(self, parent: Any) -> None:
        if self.loop is not None:  # a consumer restart: the loop is still running
            return
        context = parent.app.draftgen.get()
        settings = context.settings
        reconciler = Reconciler(context.redis, CeleryDispatcher(parent.app), settings.reconcile_settings())
        self.loop = ReconcilerLoop(
            context.redis,
            reconciler,
            interval_s=settings.reconcile_interval_s,
            name=f"{parent.hostname}/{os.getpid()}",
        ).start()

    def stop(self, parent: Any) -> None:
        """Called on consumer restarts as well as on shutdown: the loop keeps running."""

    def shutdown(self, parent: Any) -> None:
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
