"""A channel closed after its broker connection gives its unacked messages back instead of ending the worker.

This is the order Celery closes things in when Redis goes away: the connection first (kombu drops the
transport's link to the connection settings), the channels after.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Exchange, Queue

from workers.app import make_app
from workers.settings import WorkerSettings
from workers.state.broker_transport import TRANSPORT_PATH, Transport

STOCK_TRANSPORT_PATH = "kombu.transport.redis:Transport"
QUEUE_NAME = "broker-transport-test"


def queue_for(connection: Connection) -> Queue:
    return Queue(QUEUE_NAME, Exchange(QUEUE_NAME, type="direct"), routing_key=QUEUE_NAME, channel=connection)


@pytest.fixture
def unacked_channel(redis_url: str, request: pytest.FixtureRequest) -> Iterator[tuple[Connection, object]]:
    """A channel holding one message it received and did not ack, its connection then closed."""
    connection = Connection(redis_url, transport=request.param)
    queue = queue_for(connection)
    queue.declare()
    connection.default_channel.basic_publish(
        connection.default_channel.prepare_message("batch-1"), exchange=QUEUE_NAME, routing_key=QUEUE_NAME
    )
    channel = connection.channel()
    message = queue.bind(channel).get(no_ack=False)
    assert message is not None and message.body == b"batch-1"
    connection.transport.client = None  # what kombu's Connection._do_close_transport does first
    yield connection, channel
    connection.release()


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
    assert redis_client.lrange(QUEUE_NAME, 0, -1) != []


def test_a_channel_that_never_connected_fails_with_an_error_celery_reconnects_from(redis_url: str) -> None:
    connection = Connection(redis_url, transport=TRANSPORT_PATH)
    channel = connection.channel()
    connection.transport.client = None
    with pytest.raises(connection.connection_errors):
        channel._connparams()
    connection.release()


def test_the_celery_app_uses_our_transport_for_every_redis_url_and_keeps_the_scheme() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://head:6380/0"):
        connection = make_app(WorkerSettings(redis_url=url)).connection_for_write()
        assert connection.transport_cls in ("redis", "rediss")
        assert isinstance(connection.transport, Transport)
        assert connection.as_uri().startswith(url.split("://")[0] + "://")
