"""What a reader (`status`) can tell of a GPU label's worker process, without taking anything: whether its
seat's subscription is there (recovery/seat.py: Redis drops it the moment the process ends) and how old
its heartbeat is. Read-only; a Redis user without PUBSUB NUMSUB gets the heartbeat's word alone."""

from __future__ import annotations

import enum

import redis

from workers.state.heartbeats import HEARTBEAT_INTERVAL_S
from workers.state.keys import seat_channel, seat_key

FRESH_HEARTBEAT_S = 2 * HEARTBEAT_INTERVAL_S  # one missed beat is noise; two are a worker that stopped


class WorkerLife(enum.StrEnum):
    ALIVE = "alive"
    RECONNECTING = "reconnecting"  # no subscription but a fresh heartbeat: Redis restarted under it
    DEAD = "dead"  # no subscription (or none to read) and no fresh heartbeat


def seat_subscribers(client: redis.Redis, label: str) -> int | None:
    """Subscribers of the label's seated process (0 when nobody is seated); None when this Redis user
    may not ask."""
    try:
        token = client.get(seat_key(label))
        if token is None:
            return 0
        [(_, count)] = client.pubsub_numsub(seat_channel(label, token.decode(errors="replace")))
    except redis.ResponseError:  # NoPermissionError included: a user without PUBSUB NUMSUB
        return None
    return int(count)


def worker_life(subscribers: int | None, heartbeat_age_s: float | None) -> WorkerLife:
    if subscribers:
        return WorkerLife.ALIVE
    if heartbeat_age_s is not None and heartbeat_age_s <= FRESH_HEARTBEAT_S:
        return WorkerLife.ALIVE if subscribers is None else WorkerLife.RECONNECTING
    return WorkerLife.DEAD
