"""The heartbeats generate workers keep in Redis: what one says about its GPU, and reading them all.

`workers.generate.heartbeat` writes them; `status` and the metrics exporter read them.
"""

from __future__ import annotations

import msgspec
import redis

from core.records import Record
from workers.errors import RecordUnreadable
from workers.state.codec import decode_json
from workers.state.keys import WORKER_HEARTBEAT_PATTERN
from workers.state.record_limits import SMALL_RECORD_LIMIT_BYTES
from workers.state.redis_client import values_matching

HEARTBEAT_INTERVAL_S = 5.0
HEARTBEAT_TTL_S = 20  # four beats: a worker missing that many is gone
TRIAL_PLANS_IN_A_BEAT = 16  # a worker's suspects beyond these are counted, not listed


class TrialPlan(Record, frozen=True):
    """A suspect of poison a worker holds: waiting for its trial alone, or on trial (state/poison.py)."""

    run: str
    prompt_id: str
    on_trial: bool  # alone on the server now
    since: float  # unix seconds: waiting, or on trial, since then
    next_at: float | None  # unix seconds: its trial begins by then at the latest (None: on trial)
    control_s: float  # the failure-free work its server must show before it


class WorkerHeartbeat(Record, frozen=True):
    """What one generate worker says about its GPU."""

    worker: str  # the GPU label, `host/gpuN` (the `gpu` field of the runs' event streams)
    host: str
    gpu: int | None
    server_url: str
    in_flight: int  # requests at the server right now
    max_in_flight: int
    suspended: bool  # the engine stopped sending (server hung or down)
    server_health: int | None  # HTTP status of GET /health; None when it did not answer in time
    spec_accept_length: float | None  # tokens per verify step; None when the server does not say
    updated_at: float  # unix seconds, the worker's clock
    interval_s: float = HEARTBEAT_INTERVAL_S
    trials: list[TrialPlan] = msgspec.field(
        default_factory=list
    )  # its suspects, TRIAL_PLANS_IN_A_BEAT at most
    suspects: int = 0  # how many it holds in all
    trial_within_s: float | None = None  # a lone suspect's silence or wedge is judged within this
    timing_floor_s: float | None = None  # a wedge is timed no finer than this (two liveness polls)


def encode_heartbeat(beat: WorkerHeartbeat) -> bytes:
    return msgspec.json.encode(beat)


def decode_heartbeat(raw: bytes) -> WorkerHeartbeat | None:
    """The heartbeat, or None for a value that is not one (an older or foreign writer)."""
    try:
        return decode_json(raw, WorkerHeartbeat, limit_bytes=SMALL_RECORD_LIMIT_BYTES)
    except RecordUnreadable:
        return None


def read_heartbeats(client: redis.Redis) -> list[WorkerHeartbeat]:
    """Every live worker's heartbeat (expired ones are gone), sorted by worker label."""
    beats = (decode_heartbeat(raw) for _, raw in values_matching(client, WORKER_HEARTBEAT_PATTERN))
    return sorted((beat for beat in beats if beat is not None), key=lambda beat: beat.worker)
