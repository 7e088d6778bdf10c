"""Publishing batch messages fast: a few threads, each holding a producer (connection) for its life.

A publish through Celery on Redis is two round trips and some Python; threads overlap the waits.
Its app (`sending_app`) sends no task-sent events: Flower still sees every task once a worker receives it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import Celery

from workers.state.batch_priority import batch_priority
from workers.state.queues import GENERATE_TASK

PUBLISH_THREADS = 4


class BatchPublisher:
    def __init__(self, app: Celery, *, threads: int = PUBLISH_THREADS) -> None:
        self._app = app
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="publish")
        self._local = threading.local()
        self._producers: list[Any] = []
        self._lock = threading.Lock()

    def _producer(self) -> Any:
        producer = getattr(self._local, "producer", None)
        if producer is None:
            producer = self._app.producer_pool.acquire(block=True)
            self._local.producer = producer
            with self._lock:
                self._producers.append(producer)
        return producer

    def _publish_one(self, run: str, batch_id: str) -> None:
        self._app.send_task(
            GENERATE_TASK, args=[run, batch_id], producer=self._producer(), priority=batch_priority(batch_id)
        )

    def __call__(self, run: str, batch_ids: Sequence[str]) -> None:
        """Publish every batch's message; returns once all are in Redis (raises the first failure)."""
        for future in [self._pool.submit(self._publish_one, run, batch_id) for batch_id in batch_ids]:
            future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for producer in self._producers:
            producer.release()
