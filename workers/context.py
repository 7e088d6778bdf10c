"""What a worker process holds: its settings, one Redis client, and (on generate workers) one engine.

Built once per process from the environment at the edge (the Celery task module), then passed down.
"""

from __future__ import annotations

import threading
from functools import cached_property

import redis

from inference.client import SGLangClient
from inference.records import Origin
from workers.generation import GenerationEngine, RetryPolicy
from workers.runs import RunSettings, load_run_settings
from workers.settings import WorkerSettings
from workers.storage import ObjectStore, open_store
from workers.uploader import Uploader


class WorkerContext:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.redis = redis.Redis.from_url(settings.redis_url)
        self._lock = threading.Lock()
        self._run_settings: dict[str, RunSettings] = {}
        self._stores: dict[str, ObjectStore] = {}

    @cached_property
    def engine(self) -> GenerationEngine:
        settings = self.settings
        return GenerationEngine(
            lambda: SGLangClient(settings.client_settings()),
            max_in_flight=settings.max_in_flight,
            retry=RetryPolicy(
                max_attempts=settings.max_attempts,
                backoff_base_s=settings.backoff_base_s,
                backoff_cap_s=settings.backoff_cap_s,
            ),
            origin=Origin(host=settings.hostname, gpu=settings.gpu, server_url=settings.server_url),
        )

    @cached_property
    def uploader(self) -> Uploader:
        return Uploader(self.redis, self.settings.upload, self.store_for_run)

    def run_settings(self, run: str) -> RunSettings:
        """A run's settings never change once pinned, so they are read once per process."""
        with self._lock:
            if run not in self._run_settings:
                self._run_settings[run] = load_run_settings(self.redis, run)
            return self._run_settings[run]

    def store_for_run(self, run: str) -> ObjectStore:
        url = self.run_settings(run).output_url
        with self._lock:
            if url not in self._stores:
                self._stores[url] = open_store(url)
            return self._stores[url]
