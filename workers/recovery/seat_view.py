"""What a reader (`status`) can tell of a GPU label's worker process, without taking anything: whether its
seat's subscription is there (recovery/seat.py: Redis drops it the moment the process ends), how long ago
the process last stamped its seat (every SEAT_CHECK_S while it lives, again within RESUBSCRIBE_WITHIN_S of
a Redis restart), and how old its heartbeat is. A Redis user without PUBSUB NUMSUB gets the heartbeat's
word alone."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import redis

from workers.recovery.seat import HOLDER_GONE_AFTER_S
from workers.recovery.seat_stamp import decode_stamp
from workers.state.heartbeats import HEARTBEAT_INTERVAL_S
from workers.state.keys import seat_channel, seat_key, seat_seen_key

FRESH_HEARTBEAT_S = 2 * HEARTBEAT_INTERVAL_S  # one missed beat is noise; two are a worker that stopped


class WorkerLife(enum.StrEnum):
    ALIVE = "alive"
    SILENT = "silent"  # unsubscribed, stamped within HOLDER_GONE_AFTER_S: a Redis restart, or a death
    DEAD = "dead"  # unsubscribed and silent past HOLDER_GONE_AFTER_S (or, unasked, no fresh heartbeat)


@dataclass(frozen=True)
class SeatReading:
    subscribers: int | None  # of the seated process's channel; 0 with nobody seated; None: may not ask
    stamp_age_s: float | None  # since the seated process last stamped its seat; None: no stamp of it


def read_seat(client: redis.Redis, label: str, *, now_s: float) -> SeatReading:
    """The label's seat as Redis holds it now (`now_s`: the Redis clock the stamps are written in)."""
    token = client.get(seat_key(label))
    if token is None:
        return SeatReading(subscribers=0, stamp_age_s=None)
    holder = token.decode(errors="replace")
    stamp = decode_stamp(client.get(seat_seen_key(label)))
    age = max(0.0, now_s - stamp.at_s) if stamp is not None and stamp.token == holder else None
    try:
        [(_, count)] = client.pubsub_numsub(seat_channel(label, holder))
    except redis.ResponseError:  # NoPermissionError included: a user without PUBSUB NUMSUB
        return SeatReading(subscribers=None, stamp_age_s=age)
    return SeatReading(subscribers=int(count), stamp_age_s=age)


def worker_life(seat: SeatReading, heartbeat_age_s: float | None) -> WorkerLife:
    if seat.subscribers:
        return WorkerLife.ALIVE
    if seat.subscribers == 0 and seat.stamp_age_s is not None:
        return WorkerLife.SILENT if seat.stamp_age_s <= HOLDER_GONE_AFTER_S else WorkerLife.DEAD
    if heartbeat_age_s is not None and heartbeat_age_s <= FRESH_HEARTBEAT_S:
        return WorkerLife.ALIVE if seat.subscribers is None else WorkerLife.SILENT
    return WorkerLife.DEAD
