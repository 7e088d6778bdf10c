"""A generate worker's heartbeat: its GPU's live figures in Redis, for `status` and the metrics exporter.

Every `HEARTBEAT_INTERVAL_S` a small thread writes `draftgen:workers:<host>/gpu<N>` (JSON, expiring
after `HEARTBEAT_TTL_S`, so a dead worker's row disappears): requests in flight and the suspended
flag from the worker's engine, the server's /health status and its speculative accept length.
Token rates are not here: they come from the runs' completion event streams.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from inference.server_probe import HEALTH_TIMEOUT_S, INFO_TIMEOUT_S, ServerProbe
from workers.periodic import PeriodicThread
from workers.state.heartbeats import (
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_TTL_S,
    TRIAL_PLANS_IN_A_BEAT,
    TrialPlan,
    WorkerHeartbeat,
    encode_heartbeat,
)
from workers.state.keys import worker_heartbeat_key

log = logging.getLogger(__name__)

# One beat takes at most the interval plus every probe's timeout, which stays well inside the TTL.
assert HEARTBEAT_INTERVAL_S + HEALTH_TIMEOUT_S + 2 * INFO_TIMEOUT_S < HEARTBEAT_TTL_S


@dataclass(frozen=True)
class EngineFigures:
    in_flight: int
    suspended: bool
    trials: tuple[TrialPlan, ...] = ()  # the suspects of poison it holds, waiting or on trial
    trial_within_s: float | None = None  # its trials' silence limit: the liveness stall window
    timing_floor_s: float | None = None


@dataclass(frozen=True)
class WorkerIdentity:
    worker: str  # the GPU label, `host/gpuN`
    host: str
    gpu: int | None
    server_url: str
    max_in_flight: int


class HeartbeatPublisher:
    """Writes one worker's heartbeat now and then every interval, on a daemon thread, until stopped."""

    def __init__(
        self,
        client: redis.Redis,
        identity: WorkerIdentity,
        probe: ServerProbe,
        engine_figures: Callable[[], EngineFigures],
        *,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        ttl_s: int = HEARTBEAT_TTL_S,
    ) -> None:
        self._client = client
        self._identity = identity
        self._key = worker_heartbeat_key(identity.worker)
        self._probe = probe
        self._engine_figures = engine_figures
        self._interval_s = interval_s
        self._ttl_s = ttl_s
        self._beater = PeriodicThread("draftgen-heartbeat", interval_s, self.beat, first_at_once=True)
        self.last_beat: WorkerHeartbeat | None = None  # what the last beat wrote (Flower's view reads it)

    def beat(self) -> WorkerHeartbeat:
        """Take the figures and write them once."""
        figures = self._engine_figures()
        identity = self._identity
        beat = WorkerHeartbeat(
            worker=identity.worker,
            host=identity.host,
            gpu=identity.gpu,
            server_url=identity.server_url,
            in_flight=figures.in_flight,
            max_in_flight=identity.max_in_flight,
            suspended=figures.suspended,
            server_health=self._probe.health(),
            spec_accept_length=self._probe.accept_length(),
            updated_at=time.time(),
            interval_s=self._interval_s,
            trials=list(figures.trials[:TRIAL_PLANS_IN_A_BEAT]),
            suspects=len(figures.trials),
            trial_within_s=figures.trial_within_s,
            timing_floor_s=figures.timing_floor_s,
        )
        self.last_beat = beat
        self._client.set(self._key, encode_heartbeat(beat), ex=self._ttl_s)
        return beat

    def start(self) -> None:
        self._beater.start()

    def stop(self, *, timeout_s: float = HEALTH_TIMEOUT_S + 2 * INFO_TIMEOUT_S) -> None:
        """Stop beating and remove the heartbeat: a worker that shuts down cleanly leaves no stale row.
        Once stopped, stopping again (Celery stops a consumer's steps, then shuts them down) does nothing."""
        if not self._beater.running:
            return
        self._beater.stop(timeout_s=timeout_s)
        try:
            self._client.delete(self._key)
        except redis.RedisError:
            log.warning("could not remove heartbeat %s; it expires in %d s", self._key, self._ttl_s)
