"""A batch's whole life, told to Flower as the life of its generate task.

A generate message is acknowledged once its batch's prompts are all at the server (workers/generate/
tails.py: the batch's longest requests finish under its lease, while the worker takes its next batch), so
Celery's own events would show every batch succeeding in milliseconds, whatever its requests do. The
generate task sends none of its own (`send_events=False`); instead the worker tells its events here, under
the message's task id, in the shape Flower renders as a task (Celery's `task-*` events): received and
started when the worker takes the batch, succeeded with the batch's real runtime and its figures when its
last prompt settles, retried when it is handed back (a server down, the worker stopping) and failed when
given up. Flower's Tasks page then lists each batch in flight on the worker (the GPU) that holds it, and its
worker counters count batches.

Events are for people watching: one that cannot be sent (Redis away, no consumer yet) is dropped, never
raised into the batch's work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

RECEIVED, STARTED, SUCCEEDED, RETRIED, FAILED = (
    "task-received",
    "task-started",
    "task-succeeded",
    "task-retried",
    "task-failed",
)
NO_TRACEBACK = ""  # Flower shows a task's traceback field; a hand-back has a reason, not a traceback


class EventSink(Protocol):
    """Celery's event dispatcher as far as this module uses it (`EventDispatcher.send`)."""

    def send(self, type: str, **fields: object) -> object: ...


class BatchLife:
    """The events of each generate message this worker runs, from its start to its batch's end."""

    def __init__(self, task_name: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._task_name = task_name
        self._clock = clock
        self._sink: EventSink | None = None
        self._started: dict[str, float] = {}
        self._lock = threading.Lock()
        self._warned = False

    def attach(self, sink: EventSink | None) -> None:
        """Send through this dispatcher from now on (the consumer's, set again when it restarts)."""
        self._sink = sink

    def began(self, task_id: str, run: str, batch_id: str, *, retries: int = 0) -> None:
        """The worker took the batch's message: received and started at once (it runs as it arrives)."""
        with self._lock:
            self._started[task_id] = self._clock()
        args = repr([run, batch_id])
        self._send(RECEIVED, task_id, name=self._task_name, args=args, kwargs="{}", retries=retries)
        self._send(STARTED, task_id)

    def succeeded(self, task_id: str, result: str) -> None:
        """Every prompt of the batch is settled (or the message had nothing to do): its whole runtime."""
        self._send(SUCCEEDED, task_id, result=result, runtime=self._runtime_s(task_id))

    def retried(self, task_id: str, reason: str) -> None:
        """The batch was handed back; it comes back (this message again, or a new one)."""
        self._send(RETRIED, task_id, exception=reason, traceback=NO_TRACEBACK)
        self._forget(task_id)

    def failed(self, task_id: str, reason: str) -> None:
        """The batch was given up (its prompts dead-lettered) or names a run that cannot be served."""
        self._send(FAILED, task_id, exception=reason, traceback=NO_TRACEBACK)
        self._forget(task_id)

    def in_flight(self) -> int:
        """Messages begun and not yet ended: the batches this worker holds."""
        with self._lock:
            return len(self._started)

    def _runtime_s(self, task_id: str) -> float:
        with self._lock:
            started = self._started.pop(task_id, None)
        return 0.0 if started is None else max(0.0, self._clock() - started)

    def _forget(self, task_id: str) -> None:
        with self._lock:
            self._started.pop(task_id, None)

    def _send(self, type: str, task_id: str, **fields: object) -> None:
        sink = self._sink
        if sink is None:
            return
        try:
            sink.send(type, uuid=task_id, **fields)
        except Exception as error:  # an event is for watching; the batch goes on
            if not self._warned:
                self._warned = True
                log.warning(
                    "a batch event for Flower could not be sent (%s); later ones are dropped alike", error
                )
