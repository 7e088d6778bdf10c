"""Pausing and resuming a run. A paused run keeps its queue; workers hand its batches back untouched.

A pause is created with SETNX, never overwritten: the workers' Redis user may run SETNX on a run's
`paused` (their quality gate pauses) and nothing else there, so it can neither lift, shorten nor reword a
pause (deploy/redis-users.acl). A pause note that does not decode still pauses the run, and says so.
"""

from __future__ import annotations

import time

import msgspec
import redis

from core.records import Record
from workers.errors import RecordUnreadable
from workers.state.codec import decode_json
from workers.state.keys import RunKeys
from workers.state.record_limits import SMALL_RECORD_LIMIT_BYTES

PAUSED_RETRY_S = 30.0  # a worker handed a paused run's batch sends it back to the queue this late
PAUSED_BY_USER = "user"
PAUSED_BY_GATE = "quality-gate"
PAUSED_BY_OUTPUT_PIN = "output-pin"  # the uploader: run.json at the output does not confirm it
PAUSED_BY_UNKNOWN = "unknown"  # a note that does not decode
UNREADABLE_NOTE_SHOWN_BYTES = 80


class PauseState(Record, frozen=True):
    reason: str
    by: str
    at: float  # unix seconds


def pause(client: redis.Redis, run: str, reason: str, *, by: str = PAUSED_BY_USER) -> bool:
    """Pause the run; False when it was already paused (the first reason stays)."""
    state = PauseState(reason=reason, by=by, at=time.time())
    return bool(client.setnx(RunKeys(run).paused, msgspec.json.encode(state)))


def pause_state(client: redis.Redis, run: str) -> PauseState | None:
    raw = client.get(RunKeys(run).paused)
    if raw is None:
        return None
    try:
        return decode_json(raw, PauseState, limit_bytes=SMALL_RECORD_LIMIT_BYTES)
    except RecordUnreadable:
        shown = raw[:UNREADABLE_NOTE_SHOWN_BYTES].decode(errors="replace")
        reason = f"paused with an unreadable note: {shown!r}"
        return PauseState(reason=reason, by=PAUSED_BY_UNKNOWN, at=time.time())  # when it was read: no better


def resume(client: redis.Redis, run: str) -> PauseState | None:
    """Lift the pause; the quality gate then judges only completions that come after this moment."""
    keys = RunKeys(run)
    state = pause_state(client, run)
    stats = client.hgetall(keys.stats)
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(keys.paused, keys.gate_baseline)
        if stats:
            pipe.hset(keys.gate_baseline, mapping=stats)
        pipe.execute()
    return state
