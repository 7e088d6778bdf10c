"""Sending draftgen's messages through a Celery app: what the reconciler dispatches."""

from __future__ import annotations

from celery import Celery

from workers.queues import FLUSH_TASK, GENERATE_TASK


class CeleryDispatcher:
    def __init__(self, app: Celery) -> None:
        self._app = app

    def generate(self, run: str, batch_id: str) -> None:
        self._app.send_task(GENERATE_TASK, args=[run, batch_id])

    def flush(self, run: str) -> None:
        self._app.send_task(FLUSH_TASK, args=[run])
