"""Where a malformed message goes: a bounded list in Redis, each with why, and a count that outlives the list.

The process that took the message off its queue (or heard it on its channel: every subscriber of a
broadcast parks its own copy) parks it in one transaction: `draftgen:parked_messages` keeps the newest
PARKED_KEPT records (reason, detail, queue, when, size, and the first PREVIEW_BYTES of its bytes), and
`draftgen:parked_message_counts` counts every one by queue and reason, for `status` and the metrics.
A process whose Redis user may not write there (Flower's) logs the message and drops it. Nothing in a
parked message is work: draftgen's own messages always pass the check (workers/broker/message_check.py),
and a batch whose message was lost is dispatched again by the reconciler.
"""

from __future__ import annotations

import logging
from itertools import product

import msgspec
import redis

from core.records import Record
from workers.broker.message_check import Malformation
from workers.errors import MalformedMessage
from workers.state.keys import PARKED_COUNTS_KEY, PARKED_MESSAGES_KEY
from workers.state.queues import EVENT_QUEUE_PREFIX, QUEUES

log = logging.getLogger(__name__)

PARKED_KEPT = 1000  # records kept, newest first: about 1 KB each
PREVIEW_BYTES = 512
COUNT_SEPARATOR = "|"
UNACKED_QUEUE = "unacked"  # kombu's hash of delivered, unacknowledged messages, restored by every consumer
# The queues parked messages are counted by: a remote-control queue or event queue is named per process.
BROADCAST_FAMILY = "celery.pidbox"  # remote control: `<node>.celery.pidbox`
REPLY_FAMILY = "reply.celery.pidbox"  # replies to a question: `<uuid>.reply.celery.pidbox`
EVENT_FAMILY = "celeryev"  # events: `celeryev.<uuid>`
OTHER_FAMILY = "other"
QUEUE_FAMILIES = (*QUEUES, BROADCAST_FAMILY, REPLY_FAMILY, EVENT_FAMILY, UNACKED_QUEUE, OTHER_FAMILY)
UNREADABLE_RECORD = "unreadable_record"


class ParkedMessage(Record, frozen=True):
    reason: str  # a Malformation
    detail: str
    queue: str  # the queue it came from, or the queue of the channel it was heard on
    at: float  # unix seconds, by the parking process's clock
    size: int  # bytes
    preview: str  # its first PREVIEW_BYTES, bytes that are not UTF-8 escaped


class ParkedCount(Record, frozen=True):
    queue: str  # one of QUEUE_FAMILIES
    reason: str
    count: int


def parked_message(raw: bytes, queue: str, malformed: MalformedMessage, *, at: float) -> ParkedMessage:
    return ParkedMessage(
        reason=malformed.reason,
        detail=malformed.detail,
        queue=queue,
        at=at,
        size=len(raw),
        preview=_preview(raw),
    )


def queue_family(queue: str) -> str:
    if queue in QUEUES or queue == UNACKED_QUEUE:
        return queue
    if queue.endswith("." + REPLY_FAMILY):
        return REPLY_FAMILY
    if queue.endswith("." + BROADCAST_FAMILY):
        return BROADCAST_FAMILY
    if queue.startswith(EVENT_QUEUE_PREFIX):
        return EVENT_FAMILY
    return OTHER_FAMILY


def park(client: redis.Redis, parked: ParkedMessage) -> None:
    """Keep the record (the list trimmed to PARKED_KEPT) and count it, in one transaction."""
    with client.pipeline(transaction=True) as pipe:
        pipe.lpush(PARKED_MESSAGES_KEY, msgspec.json.encode(parked))
        pipe.ltrim(PARKED_MESSAGES_KEY, 0, PARKED_KEPT - 1)
        pipe.hincrby(PARKED_COUNTS_KEY, _count_field(queue_family(parked.queue), parked.reason), 1)
        pipe.execute()


def park_or_drop(client: redis.Redis, parked: ParkedMessage) -> bool:
    """Park it, saying so in the log; a Redis user that may not park (Flower's) logs it and drops it.
    Whether it was parked. A lost connection is raised: the consumer's reconnect is Celery's."""
    said = f"a malformed message from {parked.queue} ({parked.reason}: {parked.detail}; {parked.size} bytes)"
    try:
        park(client, parked)
    except redis.exceptions.ResponseError as error:  # NOPERM, or the keys of another type
        log.warning("dropped %s, not parked (%s): %.200s", said, error, parked.preview)
        return False
    log.warning("parked %s: %.200s", said, parked.preview)
    return True


def parked_counts(client: redis.Redis) -> list[ParkedCount]:
    """How many messages were parked, by queue and reason; only the fields the workers write are read."""
    fields = [_count_field(queue, reason) for queue, reason in product(QUEUE_FAMILIES, Malformation)]
    counts = []
    for field, value in zip(fields, client.hmget(PARKED_COUNTS_KEY, fields), strict=True):
        try:
            count = int(value) if value is not None else 0
        except ValueError:
            continue
        if count > 0:
            queue, _, reason = field.partition(COUNT_SEPARATOR)
            counts.append(ParkedCount(queue=queue, reason=reason, count=count))
    return counts


def recent_parked(client: redis.Redis, limit: int) -> list[ParkedMessage]:
    """The newest parked messages, at most `limit`; a record no worker wrote shows as unreadable."""
    return [_decode(raw) for raw in client.lrange(PARKED_MESSAGES_KEY, 0, min(limit, PARKED_KEPT) - 1)]


def _decode(raw: bytes) -> ParkedMessage:
    try:
        return msgspec.json.decode(raw, type=ParkedMessage)
    except msgspec.DecodeError as error:
        return ParkedMessage(
            reason=UNREADABLE_RECORD,
            detail=str(error),
            queue="?",
            at=0.0,
            size=len(raw),
            preview=_preview(raw),
        )


def _preview(raw: bytes) -> str:
    return raw[:PREVIEW_BYTES].decode("utf-8", "backslashreplace")


def _count_field(queue: str, reason: str) -> str:
    return f"{queue}{COUNT_SEPARATOR}{reason}"
