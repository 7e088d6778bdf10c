"""A queue item is judged from its bytes alone, before kombu or Celery reads it: every message draftgen sends
passes, and each way a message can be malformed is named by its reason."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery.exceptions import Retry
from celery.worker.request import Request

from tests.support import kombu_calls
from tests.support.malformed_messages import (
    IN_MEMORY,
    NO_CHAIN,
    changed,
    envelope_of,
    generate_item,
    in_memory_sender,
    popped,
    replaced,
    with_body,
    with_call,
    without_property,
)
from workers.app import make_app
from workers.broker.message_check import (
    MAX_MESSAGE_BYTES,
    Malformation,
    read_queue_item,
    read_unacked_entry,
    why_malformed,
)
from workers.errors import InvalidSetting
from workers.generate.batches import BACKLOG_RETRY_S, REDIS_UNREACHABLE_RETRY_S, UNEXPECTED_ERROR_RETRY_S
from workers.settings import WorkerSettings
from workers.state.control import PAUSED_RETRY_S
from workers.state.dispatch import CeleryDispatcher
from workers.state.queues import FLUSH_TASK, GENERATE_QUEUE, GENERATE_TASK, LONGEST_COUNTDOWN_S, UPLOAD_QUEUE

RUN, BATCH = "run-1", "0123456789abcdef"
TASK_ID = "0f0f0f0f-0000-4000-8000-000000000000"
BROADCAST = "gen0-0@node-a.celery.pidbox"  # a worker's remote-control queue
EVENTS = "celeryev.5b0c0c52-8c2e-4b8e-9d3b-6a1c0de3c0de"


@pytest.fixture
def item() -> bytes:
    """A generate message as enqueue sends it."""
    return generate_item(RUN, BATCH)


def test_every_message_draftgen_sends_is_well_formed() -> None:
    sender = in_memory_sender()
    dispatcher = CeleryDispatcher(sender)
    dispatcher.generate(RUN, BATCH)  # as enqueue and the reconciler send it
    dispatcher.generate(RUN, BATCH, countdown_s=30.0)  # handed back with a delay
    dispatcher.flush(RUN)
    assert why_malformed(popped(sender, GENERATE_QUEUE), GENERATE_QUEUE) is None
    assert why_malformed(popped(sender, GENERATE_QUEUE), GENERATE_QUEUE) is None
    assert why_malformed(popped(sender, UPLOAD_QUEUE), UPLOAD_QUEUE) is None


@pytest.fixture
def generating() -> Iterator[Any]:
    """An app whose generate task runs as a worker runs it, on a message as enqueue sends it."""
    app = make_app(WorkerSettings(redis_url=IN_MEMORY))
    CeleryDispatcher(app).generate(RUN, BATCH)
    task = app.tasks[GENERATE_TASK]
    with app.connection_for_write() as connection:
        delivered = kombu_calls.get(
            kombu_calls.queue(GENERATE_QUEUE, channel=connection.default_channel), no_ack=True
        )
    task.push_request(**Request(delivered, app=app)._request_dict, called_directly=False)
    yield app
    task.pop_request()


def test_a_message_retried_by_its_task_in_a_worker_is_well_formed(generating: Any) -> None:
    with pytest.raises(Retry):
        generating.tasks[GENERATE_TASK].retry(countdown=5)
    assert why_malformed(popped(generating, GENERATE_QUEUE), GENERATE_QUEUE) is None


def test_a_flush_sent_by_a_generate_task_in_a_worker_is_well_formed(generating: Any) -> None:
    generating.tasks[FLUSH_TASK].apply_async(args=[RUN])
    assert why_malformed(popped(generating, UPLOAD_QUEUE), UPLOAD_QUEUE) is None


def test_a_well_formed_item_is_returned_decoded(item: bytes) -> None:
    assert read_queue_item(item, GENERATE_QUEUE) == envelope_of(item)


MALFORMED: dict[str, tuple[Callable[[bytes], bytes], str, Malformation]] = {
    "not JSON": (lambda _: b"x", GENERATE_QUEUE, Malformation.NOT_JSON),
    "not UTF-8": (lambda _: b"\xff\xfe", GENERATE_QUEUE, Malformation.NOT_JSON),
    "UTF-16 (JSON that kombu, reading UTF-8, cannot decode)": (
        lambda raw: raw.decode().encode("utf-16"),
        GENERATE_QUEUE,
        Malformation.NOT_JSON,
    ),
    "a value kombu would decode as a type": (
        lambda raw: changed(raw, "headers", clock={"__type__": "uuid", "__value__": TASK_ID}),
        BROADCAST,
        Malformation.TYPED_VALUE,
    ),
    "delivery info with a field kombu does not write": (
        lambda raw: changed(raw, "properties", delivery_info={"exchange": "", "routing_key": "x", "y": 1}),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "a JSON list": (lambda _: b"[]", UPLOAD_QUEUE, Malformation.NOT_AN_OBJECT),
    "JSON null": (lambda _: b"null", GENERATE_QUEUE, Malformation.NOT_AN_OBJECT),
    "an empty object": (lambda _: b"{}", GENERATE_QUEUE, Malformation.BAD_ENVELOPE),
    "properties a list": (
        lambda raw: replaced(raw, properties=[]),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "no delivery tag": (
        lambda raw: without_property(raw, "delivery_tag"),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "no body encoding": (
        lambda raw: without_property(raw, "body_encoding"),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "a delivery tag that is a list": (
        lambda raw: changed(raw, "properties", delivery_tag=[1]),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "an unknown body encoding": (
        lambda raw: changed(raw, "properties", body_encoding="rot13"),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "delivery info a list": (
        lambda raw: changed(raw, "properties", delivery_info=[]),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "a priority that is text": (
        lambda raw: changed(raw, "properties", priority="x"),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "pickled content": (
        lambda raw: replaced(raw, **{"content-type": "application/x-python-serialize"}),
        GENERATE_QUEUE,
        Malformation.BAD_ENVELOPE,
    ),
    "headers a list": (lambda raw: replaced(raw, headers=[]), GENERATE_QUEUE, Malformation.BAD_ENVELOPE),
    "a body that is not base64": (
        lambda raw: replaced(raw, body="!!not base64"),
        GENERATE_QUEUE,
        Malformation.BODY_NOT_BASE64,
    ),
    "a body that is not JSON": (
        lambda raw: replaced(raw, body=base64.b64encode(b"xx").decode()),
        UPLOAD_QUEUE,
        Malformation.BODY_NOT_JSON,
    ),
    "a body that is an object": (
        lambda raw: with_body(raw, {}),
        GENERATE_QUEUE,
        Malformation.NOT_A_TASK_CALL,
    ),
    "a body of one item": (lambda raw: with_body(raw, [1]), GENERATE_QUEUE, Malformation.NOT_A_TASK_CALL),
    "keyword arguments": (
        lambda raw: with_body(raw, [[RUN, BATCH], {"run": RUN}, NO_CHAIN]),
        GENERATE_QUEUE,
        Malformation.NOT_A_TASK_CALL,
    ),
    "a callback": (
        lambda raw: with_body(raw, [[RUN, BATCH], {}, {**NO_CHAIN, "callbacks": [{"task": "x"}]}]),
        GENERATE_QUEUE,
        Malformation.NOT_A_TASK_CALL,
    ),
    "an unknown task": (
        lambda raw: changed(raw, "headers", task="nope"),
        GENERATE_QUEUE,
        Malformation.UNKNOWN_TASK,
    ),
    "a generate task on the upload queue": (lambda raw: raw, UPLOAD_QUEUE, Malformation.UNKNOWN_TASK),
    "no task header": (lambda raw: replaced(raw, headers={}), GENERATE_QUEUE, Malformation.UNKNOWN_TASK),
    "one argument too few": (lambda raw: with_call(raw, [RUN]), GENERATE_QUEUE, Malformation.BAD_ARGUMENTS),
    "a run that is a number": (
        lambda raw: with_call(raw, [5, BATCH]),
        GENERATE_QUEUE,
        Malformation.BAD_ARGUMENTS,
    ),
    "a run name that is no run name": (
        lambda raw: with_call(raw, ["../etc", BATCH]),
        GENERATE_QUEUE,
        Malformation.BAD_ARGUMENTS,
    ),
    "a batch id that is a list": (
        lambda raw: with_call(raw, [RUN, [1]]),
        GENERATE_QUEUE,
        Malformation.BAD_ARGUMENTS,
    ),
    "oversized": (
        lambda raw: changed(raw, "headers", argsrepr="x" * MAX_MESSAGE_BYTES),
        GENERATE_QUEUE,
        Malformation.OVERSIZED,
    ),
    "a broadcast whose body is a list": (
        lambda raw: with_body(raw, [1, 2]),
        BROADCAST,
        Malformation.NOT_AN_OBJECT,
    ),
    "an event that is a list": (lambda _: b"[]", EVENTS, Malformation.NOT_AN_OBJECT),
}


# Headers Celery would read, each set as a producer must not: Celery raised on most of them out of its event
# loop; an expired task's id is revoked in the worker; a compressed body could be a bomb; an unknown header
# becomes an attribute of the task's request, `get` among them.
BAD_HEADERS: dict[str, object] = {
    "expires": "2000-01-01T00:00:00+00:00",
    "eta": "garbage",
    "timelimit": 5,
    "stamped_headers": 5,
    "compression": "application/x-gzip",
    "get": "x",
}


@pytest.mark.parametrize(("header", "value"), list(BAD_HEADERS.items()))
def test_a_header_celery_would_choke_on_or_draftgen_never_sends_is_refused(
    header: str, value: object, item: bytes
) -> None:
    malformed = why_malformed(changed(item, "headers", **{header: value}), GENERATE_QUEUE)
    assert malformed is not None and malformed.reason == Malformation.BAD_HEADERS, malformed


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_item_is_named_with_its_reason(kind: str, item: bytes) -> None:
    make, queue, reason = MALFORMED[kind]
    malformed = why_malformed(make(item), queue)
    assert malformed is not None and malformed.reason == reason, malformed


def test_an_oversized_item_is_refused_before_anything_of_it_is_decoded() -> None:
    malformed = why_malformed(b"[" * (MAX_MESSAGE_BYTES + 1), GENERATE_QUEUE)
    assert malformed is not None and malformed.reason == Malformation.OVERSIZED


def test_json_nested_too_deep_to_decode_is_not_json_rather_than_a_crash() -> None:
    malformed = why_malformed(b"[" * (MAX_MESSAGE_BYTES // 2), GENERATE_QUEUE)
    assert malformed is not None and malformed.reason == Malformation.NOT_JSON


def test_a_broadcast_or_an_event_is_judged_as_a_message_not_as_a_task(item: bytes) -> None:
    question: dict[str, object] = {"method": "ping", "arguments": {}, "destination": None, "ticket": TASK_ID}
    heard = replaced(with_body(item, question), headers={"clock": 1, "expires": 1.0})
    assert why_malformed(heard, BROADCAST) is None
    assert why_malformed(heard, EVENTS) is None


def test_task_events_come_in_batches_and_a_batch_is_a_list_of_events(item: bytes) -> None:
    events = [{"type": "task-received", "hostname": "gen0-0@node-a"}, {"type": "task-started"}]
    assert why_malformed(with_body(item, events), EVENTS) is None
    for body, queue in (([1, 2], EVENTS), (events, BROADCAST)):
        malformed = why_malformed(with_body(item, body), queue)
        assert malformed is not None and malformed.reason == Malformation.NOT_AN_OBJECT


def test_an_unacknowledged_entry_must_be_a_task_message_routed_to_its_queue(item: bytes) -> None:
    envelope = envelope_of(item)
    assert read_unacked_entry(json.dumps([envelope, "", GENERATE_QUEUE]).encode())[0] == envelope
    for entry in (b"x", b"[1]", [envelope, "", "draftgen:run-1:done"], [envelope, "celery", GENERATE_QUEUE]):
        raw = entry if isinstance(entry, bytes) else json.dumps(entry).encode()
        with pytest.raises(ValueError, match=Malformation.BAD_UNACKED_ENTRY.value):
            read_unacked_entry(raw)
    with pytest.raises(ValueError, match=Malformation.UNKNOWN_TASK.value):
        read_unacked_entry(json.dumps([envelope, "", UPLOAD_QUEUE]).encode())


def test_a_task_held_for_later_than_draftgen_ever_waits_is_parked_and_one_within_it_is_not(
    item: bytes,
) -> None:
    """Celery holds a task until its eta, and its batch with it: a far-future eta (a node's password can
    send one) would hold its run open until then."""
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    later = now + timedelta(seconds=LONGEST_COUNTDOWN_S)
    assert (
        why_malformed(changed(item, "headers", eta=later.isoformat()), GENERATE_QUEUE, now_s=now.timestamp())
        is None
    )
    assert (
        why_malformed(changed(item, "headers", eta="2020-01-01T00:00:00"), GENERATE_QUEUE) is None
    )  # past: due
    for far in ("2099-01-01T00:00:00+00:00", "2099-01-01T00:00:00"):
        malformed = why_malformed(changed(item, "headers", eta=far), GENERATE_QUEUE, now_s=now.timestamp())
        assert malformed is not None and malformed.reason == Malformation.FAR_FUTURE, malformed
        assert "s ahead: draftgen sends no task to run over 3,600 s later" in str(malformed)


def test_every_countdown_draftgen_sends_is_within_its_longest() -> None:
    assert (
        WorkerSettings.from_env({"DRAFTGEN_SERVER_DOWN_RETRY_S": "3600"}).server_down_retry_s
        == LONGEST_COUNTDOWN_S
    )
    with pytest.raises(InvalidSetting, match=r"DRAFTGEN_SERVER_DOWN_RETRY_S='3601': must be 3600 or less"):
        WorkerSettings.from_env({"DRAFTGEN_SERVER_DOWN_RETRY_S": "3601"})
    assert (
        max(BACKLOG_RETRY_S, REDIS_UNREACHABLE_RETRY_S, UNEXPECTED_ERROR_RETRY_S, PAUSED_RETRY_S)
        < LONGEST_COUNTDOWN_S
    )
