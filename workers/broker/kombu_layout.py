"""Reading kombu's Redis layout (see workers/state/queues.py): which batches wait in the generate queue, and
dropping the unacknowledged copy of a message whose batch was dispatched again.

Only the reconciler uses this, and only to be thrifty and tidy: if a kombu release changed the layout,
tests/integration/test_kombu_layout.py fails; at run time an envelope it cannot read counts as
naming no batch, which at worst dispatches a waiting batch twice (the lease makes that harmless).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

import redis

from workers.state.queues import (
    GENERATE_QUEUE,
    GENERATE_TASK,
    KOMBU_UNACKED_INDEX_KEY,
    KOMBU_UNACKED_KEY,
    queue_lists,
)

SCAN_COUNT = 1000


def generate_batch_of(envelope: bytes | str) -> tuple[str, str] | None:
    """(run, batch id) of a generate message's envelope, or None for anything else."""
    try:
        return _batch_of_message(json.loads(envelope))
    except ValueError:
        return None


def _batch_of_message(message: dict[str, Any]) -> tuple[str, str] | None:
    try:
        if message.get("headers", {}).get("task") != GENERATE_TASK:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]), str(args[1])
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def _batch_of_unacked(value: bytes) -> tuple[str, str] | None:
    """(run, batch id) of an `unacked` hash value: JSON `[envelope, exchange, routing key]`."""
    try:
        message = json.loads(value)[0]
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return _batch_of_message(message) if isinstance(message, dict) else None


def waiting_messages(client: redis.Redis, queue: str) -> int:
    """How many messages wait in a queue, at every priority."""
    with client.pipeline(transaction=False) as pipe:
        for name in queue_lists(queue):
            pipe.llen(name)
        return sum(int(length) for length in pipe.execute())


def waiting_generate_batches(client: redis.Redis, *, max_messages: int) -> set[tuple[str, str]] | None:
    """Every (run, batch id) waiting in the generate queue, at any priority; None when it holds more than
    `max_messages` (reading it all would cost more than the check is worth: a long queue has time to
    spare)."""
    if waiting_messages(client, GENERATE_QUEUE) > max_messages:
        return None
    envelopes = waiting_envelopes(client, GENERATE_QUEUE, max_messages=max_messages)
    return {batch for envelope in envelopes if (batch := generate_batch_of(envelope)) is not None}


def waiting_envelopes(client: redis.Redis, queue: str, *, max_messages: int | None = None) -> list[bytes]:
    """The envelopes waiting in a queue, at most `max_messages` of each priority (None: all), the next to
    be delivered last."""
    last = -1 if max_messages is None else max_messages - 1
    with client.pipeline(transaction=False) as pipe:
        for name in reversed(queue_lists(queue)):
            pipe.lrange(name, 0, last)
        return [envelope for waiting in pipe.execute() for envelope in waiting]


def reserved_generate_batches(client: redis.Redis, run: str) -> set[str]:
    """The batch ids of `run` whose generate message a worker has taken and not acknowledged yet."""
    return {
        batch[1]
        for _tag, value in client.hscan_iter(KOMBU_UNACKED_KEY, count=SCAN_COUNT)
        if (batch := _batch_of_unacked(value)) is not None and batch[0] == run
    }


def drop_unacked_of_batches(client: redis.Redis, run: str, batch_ids: Iterable[str]) -> int:
    """Remove the unacknowledged messages of these batches, about to be dispatched anew: a dead worker's
    copies are then neither counted in flight nor restored hours later. Call it before dispatching, so
    the new message is never among those removed. Returns how many went."""
    wanted = {(run, batch_id) for batch_id in batch_ids}
    if not wanted:
        return 0
    tags = [
        tag
        for tag, value in client.hscan_iter(KOMBU_UNACKED_KEY, count=SCAN_COUNT)
        if _batch_of_unacked(value) in wanted
    ]
    if not tags:
        return 0
    with client.pipeline(transaction=False) as pipe:
        pipe.hdel(KOMBU_UNACKED_KEY, *tags)
        pipe.zrem(KOMBU_UNACKED_INDEX_KEY, *tags)
        removed, _ = pipe.execute()
    return int(removed)
