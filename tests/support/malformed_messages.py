"""Queue items as a consumer pops them: real ones, built by Celery and kombu in memory (no Redis), and each
made malformed in one way, as a buggy producer, a truncated write or a node's password could push it."""

from __future__ import annotations

import base64
import json
from typing import Any

from workers.state.broker import BrokerOptions, sending_app
from workers.state.dispatch import CeleryDispatcher
from workers.state.queues import GENERATE_QUEUE, UPLOAD_QUEUE

IN_MEMORY = "memory://"  # kombu's in-process broker: real envelopes, no Redis
NO_CHAIN = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def popped(app: Any, queue: str) -> bytes:
    """The raw item the broker holds for `queue`, as Redis hands it to the consumer."""
    with app.connection_for_write() as connection:
        return json.dumps(connection.default_channel._get(queue)).encode()


def in_memory_sender() -> Any:
    return sending_app(BrokerOptions(IN_MEMORY, visibility_timeout_s=7200, unacked_restore_interval_s=10))


def generate_item(run: str, batch_id: str) -> bytes:
    """A generate message exactly as enqueue and the reconciler send it."""
    sender = in_memory_sender()
    CeleryDispatcher(sender).generate(run, batch_id)
    return popped(sender, GENERATE_QUEUE)


def flush_item(run: str) -> bytes:
    sender = in_memory_sender()
    CeleryDispatcher(sender).flush(run)
    return popped(sender, UPLOAD_QUEUE)


def envelope_of(raw: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(raw)
    return decoded


def encoded(envelope: dict[str, Any]) -> bytes:
    return json.dumps(envelope).encode()


def with_body(raw: bytes, body: object) -> bytes:
    """The item with another body (JSON, then base64, as kombu writes it)."""
    envelope = envelope_of(raw)
    envelope["body"] = base64.b64encode(json.dumps(body).encode()).decode()
    return encoded(envelope)


def with_call(raw: bytes, args: list[Any]) -> bytes:
    """The task called with other arguments."""
    return with_body(raw, [args, {}, NO_CHAIN])


def changed(raw: bytes, part: str, **values: object) -> bytes:
    """The item with these fields of its `headers` or `properties` set."""
    envelope = envelope_of(raw)
    envelope[part].update(values)
    return encoded(envelope)


def replaced(raw: bytes, **fields: object) -> bytes:
    """The item with these top-level fields replaced."""
    return encoded({**envelope_of(raw), **fields})


def without_property(raw: bytes, name: str) -> bytes:
    envelope = envelope_of(raw)
    del envelope["properties"][name]
    return encoded(envelope)
