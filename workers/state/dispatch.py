"""Sending draftgen's messages through a Celery app: what the reconciler and finished batch tails send."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from workers.state.batch_priority import batch_priority
from workers.state.queues import FLUSH_TASK, GENERATE_TASK, RESUMED_BATCH_PRIORITY

if TYPE_CHECKING:  # Celery only where a message is sent: the reconciler's settings are read without it
    from celery import Celery


class Dispatcher(Protocol):
    def generate(self, run: str, batch_id: str, *, countdown_s: float = 0.0, resumed: bool = False) -> None:
        """Send the batch's generate message; a `resumed` batch (its work began) before any new one, else
        at the priority its id names."""

    def flush(self, run: str) -> None: ...


class CeleryDispatcher:
    def __init__(self, app: Celery) -> None:
        self._app = app

    def generate(self, run: str, batch_id: str, *, countdown_s: float = 0.0, resumed: bool = False) -> None:
        self._app.send_task(
            GENERATE_TASK,
            args=[run, batch_id],
            countdown=countdown_s or None,
            priority=RESUMED_BATCH_PRIORITY if resumed else batch_priority(batch_id),
        )

    def flush(self, run: str) -> None:
        self._app.send_task(FLUSH_TASK, args=[run])
