"""Batch tails: batches whose every prompt is sent, finishing after their message was acknowledged.

A generate task returns as soon as its batch's prompts are all at the server, so Celery hands the
worker its next batch while this one's longest requests run. The batch stays leased (the lease,
not the message, is what keeps it from being generated twice), and when its last prompt settles it
is settled here, on a small thread pool: finished, or handed back with a new message.

A tail holds at most its requests in flight, so tails never hold more than the window's 48 requests
between them, plus their batches' prompt lists.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from workers.generate.generation import BatchOutcome

log = logging.getLogger(__name__)

SETTLING_THREADS = 2  # settling is a few Redis calls per batch


class BatchTails:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=SETTLING_THREADS, thread_name_prefix="batch-tail")
        self._open = 0
        self._idle = threading.Condition()

    def __len__(self) -> int:
        with self._idle:
            return self._open

    def detach(self, done: Future[BatchOutcome], settle: Callable[[Future[BatchOutcome]], None]) -> None:
        """Run `settle` on a pool thread once the batch's outcome is known (or its generation failed)."""
        with self._idle:
            self._open += 1
        done.add_done_callback(lambda finished: self._executor.submit(self._settle, finished, settle))

    def _settle(self, done: Future[BatchOutcome], settle: Callable[[Future[BatchOutcome]], None]) -> None:
        try:
            settle(done)
        except Exception:  # the lease runs out and the reconciler dispatches the batch again
            log.exception("settling a batch tail failed; its lease will run out and the batch come back")
        finally:
            with self._idle:
                self._open -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Until every tail is settled, or the timeout; True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._open == 0, timeout=timeout_s)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)
