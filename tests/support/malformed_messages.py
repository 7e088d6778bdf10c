"""Queue items as a consumer pops them: real ones, built by Celery and kombu in memory (no Redis), and each
made malformed in one way, as a buggy producer, a truncated write or a node's password could push it."""

from __future__ import annotations

import base64
import json
from typing import Any

from workers.broker.broker import BrokerOptions, sending_app
from workers.broker.message_check import MAX_MESSAGE_BYTES
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


def malformed_generate_items(item: bytes, *, expired_task_id: str) -> list[tuple[bytes, str]]:
    """Every kind of malformed item on the generate queue, made from a real one, with the reason each is
    parked for; the expired copy carries `expired_task_id` (a queued task's, whose revocation it seeks)."""
    run, batch_id = json.loads(base64.b64decode(envelope_of(item)["body"]))[0]
    return [
        (b"x", "not_json"),
        (b"[]", "not_an_object"),
        (without_property(item, "delivery_tag"), "bad_envelope"),
        (without_property(item, "body_encoding"), "bad_envelope"),
        (replaced(item, body="!!not base64"), "body_not_base64"),
        (replaced(item, body=base64.b64encode(b"xx").decode()), "body_not_json"),
        (with_body(item, {}), "not_a_task_call"),
        (changed(item, "headers", task="nope"), "unknown_task"),
        (with_call(item, [run]), "bad_arguments"),
        (with_call(item, [5, batch_id]), "bad_arguments"),
        (with_call(item, ["../etc", batch_id]), "bad_arguments"),
        (with_call(item, [run, [1]]), "bad_arguments"),
        (changed(item, "headers", timelimit=5), "bad_headers"),
        (changed(item, "headers", id=expired_task_id, expires="2000-01-01T00:00:00+00:00"), "bad_headers"),
        (changed(item, "headers", argsrepr="x" * MAX_MESSAGE_BYTES), "oversized"),
    ]


def malformed_upload_items(generate: bytes, flush: bytes) -> list[tuple[bytes, str]]:
    """Every kind of malformed item on the upload queue, with the reason each is parked for."""
    return [
        (b"[]", "not_an_object"),
        (b"x", "not_json"),
        (generate, "unknown_task"),  # a generate task on the uploader's queue
        (with_call(flush, [5]), "bad_arguments"),
    ]
