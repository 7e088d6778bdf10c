"""A channel closed after its broker connection gives its unacked messages back instead of ending the worker.

This is the order Celery closes things in when Redis goes away: the connection first (kombu drops the
transport's link to the connection settings), the channels after.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from kombu.connection import Connection
from kombu.transport import redis as kombu_redis

from tests.support import kombu_calls
from workers.app import make_app
from workers.broker.broker import BrokerOptions, sending_app
from workers.broker.broker_transport import TRANSPORT_PATH, Channel, Transport
from workers.broker.kombu_layout import waiting_envelopes
from workers.settings import WorkerSettings
from workers.state.dispatch import CeleryDispatcher
from workers.state.queues import GENERATE_QUEUE, KOMBU_PRIORITY_STEPS

STOCK_TRANSPORT_PATH = "kombu.transport.redis:Transport"
RUN, BATCH = "run-1", "batch-1"
# kombu 5.7.0's methods ours repeat, changed only where an item is decoded (see broker_transport.py):
# the first 16 hex digits of the SHA-256 of their source.
REPEATED_KOMBU_METHODS: dict[Callable[..., Any], str] = {
    kombu_redis.Channel._brpop_read: "c42518699709f2df",
    kombu_redis.Channel._get: "be26a9f1eb4cf8da",
    kombu_redis.Channel._receive_one: "d59b8751d89757dc",
    kombu_redis.Channel._restore: "92e63e38835b6592",
    kombu_redis.QoS.restore_by_tag: "58e161d81b6fe18d",
}


@pytest.fixture
def unacked_channel(redis_url: str, request: pytest.FixtureRequest) -> Iterator[tuple[Connection, object]]:
    """A channel holding one generate message it received and did not ack, its connection then closed."""
    # kombu's own channel reads only its default priority steps unless told draftgen's
    connection = kombu_calls.connect(
        redis_url, transport=request.param, transport_options={"priority_steps": list(KOMBU_PRIORITY_STEPS)}
    )
    app = sending_app(BrokerOptions(redis_url, visibility_timeout_s=7200, unacked_restore_interval_s=10))
    CeleryDispatcher(app).generate(RUN, BATCH)
    channel = kombu_calls.open_channel(connection)
    message = kombu_calls.get(kombu_calls.queue(GENERATE_QUEUE, channel=channel), no_ack=False)
    assert message is not None and message.payload[0] == [RUN, BATCH]
    connection.transport.client = None  # what kombu's Connection._do_close_transport does first
    yield connection, channel
    kombu_calls.release(connection)


@pytest.mark.parametrize("unacked_channel", [STOCK_TRANSPORT_PATH], indirect=True)
def test_kombus_own_channel_ends_the_worker_with_an_attribute_error(
    unacked_channel: tuple[Connection, object],
) -> None:
    connection, channel = unacked_channel
    with pytest.raises(AttributeError):
        channel.close()  # type: ignore[attr-defined]
    channel.qos.restore_at_shutdown = False  # type: ignore[attr-defined]  # nothing to restore at exit
    assert not isinstance(AttributeError(), connection.connection_errors)


@pytest.mark.parametrize("unacked_channel", [TRANSPORT_PATH], indirect=True)
def test_our_channel_gives_the_unacked_message_back_to_its_queue(
    unacked_channel: tuple[Connection, object], redis_client: redis.Redis
) -> None:
    _, channel = unacked_channel
    channel.close()  # type: ignore[attr-defined]
    assert waiting_envelopes(redis_client, GENERATE_QUEUE) != []


def test_a_channel_that_never_connected_fails_with_an_error_celery_reconnects_from(redis_url: str) -> None:
    connection = kombu_calls.connect(redis_url, transport=TRANSPORT_PATH)
    channel = kombu_calls.open_channel(connection)
    assert isinstance(channel, Channel)
    connection.transport.client = None
    with pytest.raises(connection.connection_errors):
        channel._connparams()
    kombu_calls.release(connection)


def test_the_celery_app_uses_our_transport_for_every_redis_url_and_keeps_the_scheme() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://head:6380/0"):
        connection = make_app(WorkerSettings(redis_url=url)).connection_for_write()
        assert connection.transport_cls in ("redis", "rediss")
        assert isinstance(connection.transport, Transport)
        assert connection.as_uri().startswith(url.split("://")[0] + "://")


@pytest.mark.parametrize("method", list(REPEATED_KOMBU_METHODS), ids=lambda method: method.__qualname__)
def test_the_kombu_methods_our_channel_repeats_are_those_it_was_written_from(
    method: Callable[..., Any],
) -> None:
    # A kombu release that changed one: carry its change into workers/broker/broker_transport.py, then here.
    assert (
        hashlib.sha256(inspect.getsource(method).encode()).hexdigest()[:16] == REPEATED_KOMBU_METHODS[method]
    )
