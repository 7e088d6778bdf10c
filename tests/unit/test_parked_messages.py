"""A malformed item is parked in Redis with its reason, where the consumer would have decoded it, and the
consumer reads on; the parked list stays bounded, and its counts outlive the list."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.exceptions import Retry
from celery.worker.request import Request
from kombu.connection import Connection
from kombu.message import Message

from tests.support import kombu_calls
from workers.app import make_app
from workers.broker import parked_messages
from workers.broker.broker import BrokerOptions, sending_app
from workers.broker.broker_transport import TRANSPORT_PATH
from workers.broker.kombu_layout import waiting_envelopes
from workers.broker.message_check import Malformation, why_malformed
from workers.broker.parked_messages import (
    UNACKED_QUEUE,
    UNREADABLE_RECORD,
    ParkedCount,
    park,
    park_or_drop,
    parked_counts,
    parked_message,
    recent_parked,
)
from workers.errors import MalformedMessage
from workers.settings import WorkerSettings
from workers.state.dispatch import CeleryDispatcher
from workers.state.keys import PARKED_MESSAGES_KEY
from workers.state.queues import GENERATE_QUEUE, GENERATE_TASK, KOMBU_UNACKED_INDEX_KEY, KOMBU_UNACKED_KEY

RUN, BATCH = "run-1", "0123456789abcdef"
DRAIN_TIMEOUT_S = 5.0
KEPT_IN_TEST = 3
LONG_AGO_S = 10**6  # an unacked message delivered this long ago is past any visibility timeout


@pytest.fixture
def connection(redis_url: str) -> Iterator[Connection]:
    with kombu_calls.connect(redis_url, transport=TRANSPORT_PATH) as connected:
        yield connected


def send_generate(redis_url: str) -> None:
    app = sending_app(BrokerOptions(redis_url, visibility_timeout_s=7200, unacked_restore_interval_s=10))
    CeleryDispatcher(app).generate(RUN, BATCH)


def taken_unacknowledged(connection: Connection, redis_url: str) -> Message:
    """A generate message as enqueue sends it, taken by a consumer that has not acknowledged it yet."""
    send_generate(redis_url)
    delivered = kombu_calls.get(
        kombu_calls.queue(GENERATE_QUEUE, channel=connection.default_channel), no_ack=False
    )
    assert delivered is not None
    return delivered


def a_record(reason: Malformation = Malformation.NOT_JSON) -> parked_messages.ParkedMessage:
    return parked_message(b"x", GENERATE_QUEUE, MalformedMessage(reason, "because"), at=time.time())


def test_a_malformed_item_is_parked_and_the_next_good_one_is_delivered_at_once(
    connection: Connection, redis_client: redis.Redis, redis_url: str
) -> None:
    received: list[Message] = []
    queue = kombu_calls.queue(GENERATE_QUEUE)
    with kombu_calls.consumer(
        connection, [queue], callbacks=[lambda _body, message: received.append(message)]
    ):
        redis_client.lpush(GENERATE_QUEUE, b"x")  # popped first: BRPOP takes the oldest
        send_generate(redis_url)
        while not received:
            kombu_calls.drain_events(connection, timeout=DRAIN_TIMEOUT_S)
    assert received[0].headers["task"] == GENERATE_TASK
    [parked] = recent_parked(redis_client, limit=10)
    assert (parked.reason, parked.queue, parked.size, parked.preview) == ("not_json", GENERATE_QUEUE, 1, "x")
    assert parked_counts(redis_client) == [ParkedCount(queue=GENERATE_QUEUE, reason="not_json", count=1)]


def test_a_malformed_item_taken_by_a_direct_get_is_parked_too(
    connection: Connection, redis_client: redis.Redis
) -> None:
    redis_client.lpush(GENERATE_QUEUE, b"[]")
    assert kombu_calls.get(kombu_calls.queue(GENERATE_QUEUE, channel=connection.default_channel)) is None
    assert [record.reason for record in recent_parked(redis_client, limit=10)] == ["not_an_object"]


def test_an_unreadable_unacked_entry_is_parked_and_does_not_keep_the_others_from_their_queue(
    connection: Connection, redis_client: redis.Redis, redis_url: str
) -> None:
    delivered = taken_unacknowledged(connection, redis_url)
    redis_client.hset(KOMBU_UNACKED_KEY, "forged", b"x")
    old = time.time() - LONG_AGO_S
    redis_client.zadd(KOMBU_UNACKED_INDEX_KEY, {"forged": old - 1, delivered.delivery_tag: old})

    connection.default_channel.qos.restore_visible()

    assert redis_client.hlen(KOMBU_UNACKED_KEY) == 0
    [restored] = waiting_envelopes(redis_client, GENERATE_QUEUE)
    assert json.loads(restored)["headers"]["task"] == GENERATE_TASK
    [parked] = recent_parked(redis_client, limit=10)
    assert (parked.reason, parked.queue) == ("bad_unacked_entry", UNACKED_QUEUE)


def test_the_parked_list_keeps_the_newest_and_the_counts_keep_them_all(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parked_messages, "PARKED_KEPT", KEPT_IN_TEST)
    for number in range(KEPT_IN_TEST + 2):
        park(
            redis_client,
            parked_message(b"x", GENERATE_QUEUE, MalformedMessage("not_json", str(number)), at=0),
        )
    assert [record.detail for record in recent_parked(redis_client, limit=10)] == ["4", "3", "2"]
    assert parked_counts(redis_client) == [ParkedCount(queue=GENERATE_QUEUE, reason="not_json", count=5)]


def test_a_long_item_is_kept_as_its_size_and_a_bounded_preview(redis_client: redis.Redis) -> None:
    raw = b"\xff" + b"y" * 10_000
    park(redis_client, parked_message(raw, GENERATE_QUEUE, MalformedMessage("oversized", "big"), at=0))
    [parked] = recent_parked(redis_client, limit=1)
    assert parked.size == len(raw)
    assert parked.preview.startswith("\\xffyyy") and len(parked.preview) < parked_messages.PREVIEW_BYTES + 4


class RefusingPipeline:
    """A pipeline of a Redis user that may not park (Flower's): Redis refuses the transaction."""

    def __enter__(self) -> RefusingPipeline:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def __getattr__(self, _name: str) -> Any:
        return lambda *_args, **_kwargs: None

    def execute(self) -> None:
        raise redis.exceptions.NoPermissionError("this user has no permissions to access the key")


class RefusingClient:
    def pipeline(self, transaction: bool = True) -> RefusingPipeline:
        return RefusingPipeline()


def test_a_process_that_may_not_park_logs_the_message_and_drops_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        parked = park_or_drop(RefusingClient(), a_record())
    assert not parked
    assert "dropped a malformed message from generate (not_json: because; 1 bytes)" in caplog.text


def test_a_record_no_worker_wrote_is_listed_as_unreadable(redis_client: redis.Redis) -> None:
    redis_client.lpush(PARKED_MESSAGES_KEY, b"forged")
    [record] = recent_parked(redis_client, limit=5)
    assert record.reason == UNREADABLE_RECORD and record.preview == "forged"


def test_a_message_kombu_restored_and_its_task_then_retried_are_well_formed(
    connection: Connection, redis_client: redis.Redis, redis_url: str
) -> None:
    delivered = taken_unacknowledged(connection, redis_url)
    kombu_calls.requeue(delivered)  # given back to its queue as a worker's restore does: marked redelivered
    [restored] = waiting_envelopes(redis_client, GENERATE_QUEUE)
    assert json.loads(restored)["headers"]["redelivered"] is True
    assert why_malformed(restored, GENERATE_QUEUE) is None
    app = make_app(WorkerSettings(redis_url=redis_url))
    again = kombu_calls.get(
        kombu_calls.queue(GENERATE_QUEUE, channel=connection.default_channel), no_ack=True
    )
    task = app.tasks[GENERATE_TASK]
    task.push_request(**Request(again, app=app)._request_dict, called_directly=False)
    try:
        with pytest.raises(Retry):
            task.retry(countdown=5)
    finally:
        task.pop_request()
    [retried] = waiting_envelopes(redis_client, GENERATE_QUEUE)
    assert why_malformed(retried, GENERATE_QUEUE) is None
