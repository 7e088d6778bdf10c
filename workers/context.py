"""What a worker process holds: its settings, one Redis client and, built on first use, the generation
engine, the batch leases and the uploader.

One `WorkerContext` per process, built from the settings the app was made with (the process edge)
and handed to the tasks and the bootsteps through the app's `ContextHolder`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from core.records import Origin
from core.run_settings.model import RunSettings
from inference.client import SGLangClient
from inference.server_probe import ServerProbe
from workers.generate.batch_life import BatchLife
from workers.generate.generation import GenerationEngine, RetryPolicy
from workers.generate.server_record import ServerRecord
from workers.generate.tails import BatchTails
from workers.generate.trials import TrialSettings
from workers.record.object_store import ObjectStore
from workers.record.storage import open_store
from workers.record.uploader import Uploader
from workers.recovery.leases import LeaseKeeper
from workers.recovery.seat import Seat, stop_this_process
from workers.settings import WorkerSettings
from workers.state.dispatch import Dispatcher
from workers.state.ledger import gpu_label, server_identity
from workers.state.queues import GENERATE_TASK
from workers.state.redis_client import connect, retry_briefly
from workers.state.runs import load_run_settings

log = logging.getLogger(__name__)

T = TypeVar("T")


TAILS_SETTLE_MARGIN_S = 5.0  # beyond the shutdown grace: the tails' hand-backs are a few Redis calls


class WorkerContext:
    # Set by the ContextHolder from the app (the process edge): how batch tails send messages.
    dispatcher: Dispatcher | None = None

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.tails = BatchTails()
        self.batch_life = BatchLife(GENERATE_TASK)  # its events reach Flower once a consumer attaches them
        self.redis = connect(settings.redis_url)
        self.origin = Origin(host=settings.hostname, gpu=settings.gpu, server_url=settings.server_url)
        # Taken at worker_init on generate workers only (seating.py); its token marks this process's leases.
        self.seat = Seat(self.redis, gpu_label(self.origin), on_lost=stop_this_process)
        self.stopping = threading.Event()  # set on SIGTERM: take no new batch, hand held ones back
        self._lock = threading.Lock()
        self._run_settings: dict[str, RunSettings] = {}
        self._stores: dict[str, ObjectStore] = {}
        self._engine: GenerationEngine | None = None
        self._leases: LeaseKeeper | None = None
        self._uploader: Uploader | None = None
        self._server_record: ServerRecord | None = None

    def _once(self, name: str, build: Callable[[], T]) -> T:
        with self._lock:
            value: T | None = getattr(self, name)
            if value is None:
                value = build()
                setattr(self, name, value)
            return value

    @property
    def engine(self) -> GenerationEngine:
        settings = self.settings
        return self._once(
            "_engine",
            lambda: GenerationEngine(
                lambda: SGLangClient(settings.client_settings()),
                max_in_flight=settings.max_in_flight,
                retry=RetryPolicy(
                    max_attempts=settings.max_attempts,
                    backoff_base_s=settings.backoff_base_s,
                    backoff_cap_s=settings.backoff_cap_s,
                ),
                origin=self.origin,
                server_identity=server_identity(self.seat.token),
                silence_limit_s=settings.silence_limit_s,
                trials=TrialSettings.for_liveness(
                    stall_s=settings.liveness_stall_s, poll_s=settings.liveness_poll_s
                ),
            ),
        )

    @property
    def leases(self) -> LeaseKeeper:
        settings = self.settings
        return self._once(
            "_leases",
            lambda: LeaseKeeper(
                self.redis,
                worker=gpu_label(self.origin),
                seat=self.seat.token,
                ttl_s=settings.lease_ttl_s,
                renew_s=settings.lease_renew_s,
            ).start(),
        )

    @property
    def server_record(self) -> ServerRecord:
        settings = self.settings
        return self._once(
            "_server_record",
            lambda: ServerRecord(self.redis, ServerProbe(settings.server_url, settings.api_key), self.origin),
        )

    @property
    def uploader(self) -> Uploader:
        return self._once("_uploader", lambda: Uploader(self.redis, self.settings.upload, self.store_for_run))

    def run_settings(self, run: str) -> RunSettings:
        """A run's settings never change once pinned, so they are read once per process."""
        with self._lock:
            if run not in self._run_settings:
                self._run_settings[run] = load_run_settings(self.redis, run)
            return self._run_settings[run]

    def store_for_run(self, run: str) -> ObjectStore:
        url = self.run_settings(run).output
        with self._lock:
            if url not in self._stores:
                self._stores[url] = open_store(url)
            return self._stores[url]

    def dispatch_generate(
        self, run: str, batch_id: str, *, countdown_s: float, resumed: bool = False
    ) -> None:
        if self.dispatcher is None:  # no app: the reconciler sends the batch again once its delay is over
            log.warning(
                "batch %s of run %s handed back without a message; the reconciler resends it", batch_id, run
            )
            return
        self.dispatcher.generate(run, batch_id, countdown_s=countdown_s, resumed=resumed)

    def dispatch_flush(self, run: str) -> None:
        if self.dispatcher is not None:
            self.dispatcher.flush(run)

    def begin_shutdown(self) -> None:
        """SIGTERM: no new batch starts; requests in flight get the grace period, the rest go back."""
        self.stopping.set()
        retry_briefly(self.redis)
        with self._lock:
            engine = self._engine
        if engine is not None:
            log.warning(
                "shutting down: %d requests in flight get %.0f s; held batches go back to the queue",
                engine.in_flight,
                self.settings.shutdown_grace_s,
            )
            engine.drain(grace_s=self.settings.shutdown_grace_s)

    def close(self) -> None:
        if not self.tails.wait_idle(self.settings.shutdown_grace_s + TAILS_SETTLE_MARGIN_S):
            log.warning(
                "%d batch tails unsettled at exit: their leases run out and they come back", len(self.tails)
            )
        self.tails.close()
        with self._lock:
            engine, leases = self._engine, self._leases
            self._engine = self._leases = None
        if leases is not None:
            leases.stop()
        self.seat.release()
        if engine is not None:
            engine.close()
        self.redis.close()


class ContextHolder:
    """Builds the process's context on first use, from the settings the app was made with."""

    def __init__(
        self,
        settings: WorkerSettings,
        factory: Callable[[WorkerSettings], WorkerContext],
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.settings = settings
        self._factory = factory
        self._dispatcher = dispatcher
        self._context: WorkerContext | None = None
        self._lock = threading.Lock()

    def get(self) -> WorkerContext:
        with self._lock:
            if self._context is None:
                self._context = self._factory(self.settings)
                self._context.dispatcher = self._dispatcher
            return self._context

    def built(self) -> WorkerContext | None:
        with self._lock:
            return self._context

    def close(self) -> None:
        with self._lock:
            context, self._context = self._context, None
        if context is not None:
            context.close()
