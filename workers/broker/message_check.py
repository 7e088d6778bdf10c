"""Is a queue item one of draftgen's messages? Checked from its raw bytes, before kombu or Celery reads it.

kombu and Celery trust what they pop: one byte out of place (not JSON, a list, a field missing, a body
that is not base64, a time limit that is a number) raised out of the event loop and ended every consumer
of the queue, and every subscriber of the broadcast. So each item is bounded before it is decoded, and
everything kombu and Celery read of it is checked to be what draftgen's own senders write
(workers/state/queues.py describes the layout). A message that fails is parked, never delivered
(workers/broker/broker_transport.py, workers/broker/parked_messages.py).

Every item (tasks, remote-control broadcasts and replies, events): at most MAX_MESSAGE_BYTES; a JSON
object whose `properties` hold a string `delivery_tag`, `body_encoding` base64 and a `delivery_info`
object; JSON content in UTF-8; `headers` an object without `compression` (a compressed body could be a
bomb); `body` the base64 of JSON. A broadcast, reply or event body is a JSON object (task events come in
batches: a list of objects).

A task (the `generate` and `upload` queues): only the fields, headers and properties Celery 5.7 writes,
each of its type, with no expiry (an expired task id is revoked in the worker: a copy of a queued task
with a past `expires` would discard the real one), no time limits, no group, no compression; the one
task its queue carries; a body `[args, {}, embed]` without callbacks; the arguments that task takes; an
`eta` at most draftgen's longest countdown ahead of the reader's clock (`LONGEST_COUNTDOWN_S`, with
`CLOCK_SKEW_S`): Celery holds a task until its eta, and a batch with it, which would hold its run open.

`why_malformed` answers for raw bytes without Celery (the schedule explorer uses it); `read_queue_item` and
`read_unacked_entry` return what they checked, or raise MalformedMessage.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from workers.errors import InvalidRunName, MalformedMessage
from workers.state.keys import check_run_name
from workers.state.queues import (
    CLOCK_SKEW_S,
    EVENT_QUEUE_PREFIX,
    FLUSH_TASK,
    GENERATE_TASK,
    LONGEST_COUNTDOWN_S,
    TASK_OF_QUEUE,
)

# Our own messages are a few hundred bytes; the largest legitimate item is a reply to
# `celery inspect conf --include-defaults`, about 15 KB. Checked before anything is decoded.
MAX_MESSAGE_BYTES = 64 * 1024
MAX_TAG_CHARS = 128  # delivery tags and task ids are uuids (36 characters)
BATCH_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")  # producer/enqueue/enqueuer.py: 16 hex digits
MAX_PRIORITY = 255  # kombu's priorities are 0-9; AMQP allows a byte
CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"
BODY_ENCODING = "base64"
ENVELOPE_FIELDS = frozenset({"body", "content-encoding", "content-type", "headers", "properties"})
EMBED_FIELDS = frozenset({"callbacks", "errbacks", "chain", "chord"})  # all None: draftgen chains nothing
UNACKED_EXCHANGE = ""  # task messages are published to the default exchange, routed by queue name
DELIVERY_INFO_FIELDS = frozenset({"exchange", "routing_key", "redelivered"})
# kombu's JSON decodes an object of exactly these keys into a value of that type (or fails on a type it
# does not know): draftgen sends none, and what the check read must be what kombu will read.
KOMBU_TYPED_VALUE_KEYS = frozenset({"__type__", "__value__"})


class Malformation(StrEnum):
    """Why a message was parked: one word each, to count them by."""

    OVERSIZED = "oversized"
    NOT_JSON = "not_json"
    NOT_AN_OBJECT = "not_an_object"
    BAD_ENVELOPE = "bad_envelope"
    BAD_HEADERS = "bad_headers"
    BODY_NOT_BASE64 = "body_not_base64"
    BODY_NOT_JSON = "body_not_json"
    NOT_A_TASK_CALL = "not_a_task_call"
    UNKNOWN_TASK = "unknown_task"
    BAD_ARGUMENTS = "bad_arguments"
    BAD_UNACKED_ENTRY = "bad_unacked_entry"
    TYPED_VALUE = "typed_value"
    FAR_FUTURE = "far_future"  # an eta beyond draftgen's longest countdown
    CONSUMER_FAILED = "consumer_failed"  # well-formed, yet its consumer raised on it (a broadcast, an event)


def _malformed(reason: Malformation, detail: str) -> MalformedMessage:
    return MalformedMessage(reason.value, detail)


def why_malformed(raw: bytes, queue: str, *, now_s: float | None = None) -> MalformedMessage | None:
    """None when `raw`, popped from `queue` (or heard on a channel whose queue that is) at Unix time
    `now_s` (the clock's, by default), is one of draftgen's messages; else what is wrong with it."""
    try:
        read_queue_item(raw, queue, now_s=now_s)
    except MalformedMessage as malformed:
        return malformed
    return None


def read_queue_item(raw: bytes, queue: str, *, now_s: float | None = None) -> dict[str, Any]:
    """The envelope of an item of `queue`, checked; MalformedMessage when it is not one of our messages."""
    return _check_envelope(_json(raw, Malformation.NOT_JSON), queue, _clock(now_s))


def _clock(now_s: float | None) -> float:
    return time.time() if now_s is None else now_s


def read_unacked_entry(raw: bytes, *, now_s: float | None = None) -> tuple[dict[str, Any], str, str]:
    """A value of kombu's `unacked` hash, `[envelope, exchange, routing key]`, checked: only a task message
    is delivered with an acknowledgement, so only a task message may be there."""
    entry = _json(raw, Malformation.BAD_UNACKED_ENTRY)
    if not (isinstance(entry, list) and len(entry) == 3):
        raise _malformed(Malformation.BAD_UNACKED_ENTRY, "not [envelope, exchange, routing key]")
    envelope, exchange, routing_key = entry
    if exchange != UNACKED_EXCHANGE or routing_key not in TASK_OF_QUEUE:
        raise _malformed(
            Malformation.BAD_UNACKED_ENTRY,
            f"routed by exchange {_show(exchange)} and key {_show(routing_key)}, not to a task queue",
        )
    return _check_envelope(envelope, routing_key, _clock(now_s)), exchange, routing_key


def _check_envelope(envelope: object, queue: str, now_s: float) -> dict[str, Any]:
    """A decoded envelope, checked as an item of `queue` (a task of that queue, or any other message)."""
    if not isinstance(envelope, dict):
        raise _malformed(Malformation.NOT_AN_OBJECT, f"a JSON {type(envelope).__name__}, not an object")
    task = TASK_OF_QUEUE.get(queue)
    _check_properties(envelope.get("properties"), strict=task is not None)
    _check_content(envelope)
    headers = envelope.get("headers")
    if not isinstance(headers, dict):
        raise _malformed(Malformation.BAD_ENVELOPE, f"headers are {_show(headers)}, not an object")
    if "compression" in headers:
        raise _malformed(Malformation.BAD_HEADERS, "a compressed body: draftgen compresses no message")
    body = _body(envelope.get("body"))
    if task is None:
        _check_message_body(body, queue)
        return envelope
    if extra := set(envelope) - ENVELOPE_FIELDS:
        raise _malformed(Malformation.BAD_ENVELOPE, f"fields Celery does not write: {sorted(extra)}")
    _check_task_headers(headers, task, queue)
    _check_eta(headers.get("eta"), now_s)
    _check_task_call(body, task)
    return envelope


def _json(raw: bytes, reason: Malformation) -> Any:
    if len(raw) > MAX_MESSAGE_BYTES:
        raise _malformed(Malformation.OVERSIZED, f"{len(raw)} bytes, over the {MAX_MESSAGE_BYTES} allowed")
    try:
        return json.loads(raw.decode(CONTENT_ENCODING), object_hook=_plain_object)
    except MalformedMessage:
        raise
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise _malformed(reason, f"{type(error).__name__}: {error}") from error


def _plain_object(value: dict[str, Any]) -> dict[str, Any]:
    if value.keys() == KOMBU_TYPED_VALUE_KEYS:
        kind = _show(value["__type__"])
        raise _malformed(Malformation.TYPED_VALUE, f"a value kombu would decode as a {kind}")
    return value


def _check_properties(properties: object, *, strict: bool) -> None:
    if not isinstance(properties, dict):
        raise _malformed(Malformation.BAD_ENVELOPE, f"properties are {_show(properties)}, not an object")
    for name, valid in _PROPERTIES.items():
        if name in properties and not valid(properties[name]):
            raise _malformed(Malformation.BAD_ENVELOPE, f"property {name!r} is {_show(properties[name])}")
    for name in _REQUIRED_PROPERTIES:
        if name not in properties:
            raise _malformed(Malformation.BAD_ENVELOPE, f"no property {name!r}")
    if strict and (extra := set(properties) - set(_PROPERTIES)):
        raise _malformed(Malformation.BAD_ENVELOPE, f"properties Celery does not write: {sorted(extra)}")


def _check_content(envelope: dict[str, Any]) -> None:
    content = (envelope.get("content-type"), envelope.get("content-encoding"))
    if content != (CONTENT_TYPE, CONTENT_ENCODING):
        raise _malformed(Malformation.BAD_ENVELOPE, f"content {_show(content)}: draftgen sends JSON in UTF-8")


def _body(body: object) -> Any:
    if not isinstance(body, str):
        raise _malformed(Malformation.BODY_NOT_BASE64, f"the body is {_show(body)}, not a string")
    try:
        decoded = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as error:
        raise _malformed(Malformation.BODY_NOT_BASE64, str(error)) from error
    return _json(decoded, Malformation.BODY_NOT_JSON)


def _check_message_body(body: Any, queue: str) -> None:
    """A broadcast's, a reply's or an event's: a JSON object; a worker sends task events in batches, lists."""
    batch = body if isinstance(body, list) and queue.startswith(EVENT_QUEUE_PREFIX) else [body]
    if not all(isinstance(one, dict) for one in batch):
        raise _malformed(Malformation.NOT_AN_OBJECT, f"the body is {_show(body)}, not a JSON object")


def _check_task_headers(headers: dict[str, Any], task: str, queue: str) -> None:
    if headers.get("task") != task:
        named = _show(headers.get("task"))
        raise _malformed(Malformation.UNKNOWN_TASK, f"task {named} on queue {queue!r}, which carries {task}")
    for name in _REQUIRED_HEADERS:
        if name not in headers:
            raise _malformed(Malformation.BAD_HEADERS, f"no header {name!r}")
    for name, value in headers.items():
        valid = _TASK_HEADERS.get(name)
        if valid is None:
            raise _malformed(Malformation.BAD_HEADERS, f"header {name!r}, which Celery 5.7 does not write")
        if not valid(value):
            raise _malformed(Malformation.BAD_HEADERS, f"header {name!r} is {_show(value)}")


def _check_eta(eta: object, now_s: float) -> None:
    """A task held for later runs within draftgen's longest countdown (the header's form is checked)."""
    if not isinstance(eta, str):
        return
    moment = datetime.fromisoformat(eta)
    at_s = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()
    ahead_s = at_s - now_s
    if ahead_s > LONGEST_COUNTDOWN_S + CLOCK_SKEW_S:
        raise _malformed(
            Malformation.FAR_FUTURE,
            f"eta {_show(eta)}, {ahead_s:,.0f} s ahead: draftgen sends no task to run over "
            f"{LONGEST_COUNTDOWN_S:,.0f} s later",
        )


def _check_task_call(body: Any, task: str) -> None:
    if not (isinstance(body, list) and len(body) == 3):
        raise _malformed(Malformation.NOT_A_TASK_CALL, f"body {_show(body)}, not [args, kwargs, embed]")
    args, kwargs, embed = body
    if not isinstance(args, list) or kwargs != {}:
        raise _malformed(Malformation.NOT_A_TASK_CALL, f"args {_show(args)}, kwargs {_show(kwargs)}")
    chained = not isinstance(embed, dict) or any(
        name not in EMBED_FIELDS or value is not None for name, value in embed.items()
    )
    if chained:
        raise _malformed(Malformation.NOT_A_TASK_CALL, f"embed {_show(embed)}: draftgen chains no task")
    _ARGUMENT_CHECKS[task](args)


def _check_generate_arguments(args: list[Any]) -> None:
    if len(args) != 2:
        raise _malformed(Malformation.BAD_ARGUMENTS, f"{len(args)} arguments: generate takes (run, batch id)")
    _check_run(args[0])
    batch_id = args[1]
    if not (isinstance(batch_id, str) and BATCH_ID_PATTERN.fullmatch(batch_id)):
        raise _malformed(Malformation.BAD_ARGUMENTS, f"batch id {_show(batch_id)} is not a batch id")


def _check_flush_arguments(args: list[Any]) -> None:
    if len(args) != 1:
        raise _malformed(Malformation.BAD_ARGUMENTS, f"{len(args)} arguments: flush takes (run)")
    _check_run(args[0])


def _check_run(run: object) -> None:
    if not isinstance(run, str):
        raise _malformed(Malformation.BAD_ARGUMENTS, f"run {_show(run)} is not a string")
    try:
        check_run_name(run)
    except InvalidRunName as error:
        raise _malformed(Malformation.BAD_ARGUMENTS, str(error)) from error


def _show(value: object) -> str:
    """A value in an explanation: its repr, cut short (a parked message's detail is bounded)."""
    shown = repr(value)
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 1] + "…"


_SHOWN_CHARS = 80


def _string(value: object) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TAG_CHARS


def _tag(value: object) -> bool:
    return _string(value) and value != ""


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _time(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _delivery_info(value: object) -> bool:
    return (
        isinstance(value, dict)
        and value.keys() <= DELIVERY_INFO_FIELDS
        and isinstance(value.get("exchange"), str)
        and isinstance(value.get("routing_key"), str)
        and isinstance(value.get("redelivered", False), bool)
    )


def _any_text(value: object) -> bool:
    return isinstance(value, str)


_PROPERTIES: Mapping[str, Callable[[object], bool]] = {
    "delivery_tag": _tag,
    "body_encoding": lambda value: value == BODY_ENCODING,
    "delivery_info": _delivery_info,
    "priority": lambda value: _count(value) and value in range(MAX_PRIORITY + 1),
    "delivery_mode": _count,
    "correlation_id": _optional(_string),
    "reply_to": _optional(_string),
    "origin": _optional(_any_text),  # a retry's: Celery passes the request's origin on as a property
}
_REQUIRED_PROPERTIES = ("delivery_tag", "body_encoding", "delivery_info")
# What Celery 5.7 writes in a task message's headers (celery.app.amqp.AMQP.as_task_v2) and kombu adds when
# it restores one, and what draftgen puts there: no expiry, no time limits, no group, no stamps.
_TASK_HEADERS: Mapping[str, Callable[[object], bool]] = {
    "lang": lambda value: value == "py",
    "task": _any_text,
    "id": _tag,
    "shadow": lambda value: value is None,
    "eta": _optional(_time),
    "expires": lambda value: value is None,
    "group": lambda value: value is None,
    "group_index": lambda value: value is None,
    "retries": _count,
    "timelimit": lambda value: value == [None, None],
    "root_id": _optional(_tag),
    "parent_id": _optional(_tag),
    "argsrepr": _optional(_any_text),
    "kwargsrepr": _optional(_any_text),
    "origin": _optional(_any_text),
    "ignore_result": lambda value: value is None or isinstance(value, bool),
    "replaced_task_nesting": _count,
    "stamped_headers": lambda value: value is None or value == [],
    "stamps": lambda value: value == {},
    "redelivered": lambda value: isinstance(value, bool),  # kombu's, on a message it restored
}
_REQUIRED_HEADERS = ("id", "task")
_ARGUMENT_CHECKS: Mapping[str, Callable[[list[Any]], None]] = {
    GENERATE_TASK: _check_generate_arguments,
    FLUSH_TASK: _check_flush_arguments,
}
