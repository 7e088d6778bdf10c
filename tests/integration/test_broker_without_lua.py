"""kombu's consumer chores under a Redis user that may run no script at all (no EVAL, EVALSHA or SCRIPT),
as the workers' user is: messages past their visibility timeout come back, the restore lock is released
only by its holder, and binding tables are kept alive and swept as kombu's own scripts would."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from kombu.connection import Connection
from kombu.entity import Queue
from redis.exceptions import LockNotOwnedError

from tests.support import kombu_calls
from workers.broker.broker import BrokerOptions, sending_app
from workers.broker.broker_transport import TRANSPORT_PATH
from workers.broker.broker_without_lua import RedisWithoutLuaLocks
from workers.broker.kombu_layout import waiting_messages
from workers.state.dispatch import CeleryDispatcher
from workers.state.queues import GENERATE_QUEUE

pytestmark = pytest.mark.integration

SCRIPTLESS = "scriptless"
SCRIPTLESS_PASSWORD = "scriptless-password"
EXPIRING_S = 10.0  # a queue declared with x-expires, as Celery's remote-control queues are
LOCK_S = 5.0
DEADLINES = "_kombu.binding_deadlines"


def table(exchange: str) -> str:
    return f"_kombu.binding.{exchange}"


def permanent(exchange: str) -> str:
    return f"_kombu.binding_permanent.{exchange}"


@pytest.fixture
def scriptless_url(redis_client: redis.Redis, redis_url: str) -> Iterator[str]:
    """A user who may run every command on every key, except scripts and functions."""
    redis_client.acl_setuser(
        SCRIPTLESS,
        enabled=True,
        passwords=[f"+{SCRIPTLESS_PASSWORD}"],
        commands=["+@all", "-@scripting"],
        keys=["~*"],
        channels=["*"],
    )
    parts = urlsplit(redis_url)
    netloc = f"{SCRIPTLESS}:{SCRIPTLESS_PASSWORD}@{parts.hostname}:{parts.port}"
    yield urlunsplit(parts._replace(netloc=netloc))
    assert [entry for entry in redis_client.acl_log() if entry["username"] == SCRIPTLESS] == []
    redis_client.acl_log_reset()
    redis_client.acl_deluser(SCRIPTLESS)


def expiring_queue(name: str, connection: Connection) -> Queue:
    exchange = kombu_calls.exchange(name, type="direct")
    return kombu_calls.queue(name, exchange, routing_key=name, expires=EXPIRING_S, channel=connection)


def test_a_message_past_its_visibility_timeout_comes_back_to_its_queue(
    scriptless_url: str, redis_client: redis.Redis
) -> None:
    connection = kombu_calls.connect(
        scriptless_url, transport=TRANSPORT_PATH, transport_options={"visibility_timeout": 0}
    )
    sender = sending_app(BrokerOptions(scriptless_url, visibility_timeout_s=0, unacked_restore_interval_s=10))
    CeleryDispatcher(sender).generate("run-1", "batch-1")
    channel = connection.default_channel
    taken = kombu_calls.get(kombu_calls.queue(GENERATE_QUEUE, channel=channel), no_ack=False)
    assert taken is not None and waiting_messages(redis_client, GENERATE_QUEUE) == 0

    channel.qos.restore_visible(num=1)

    assert waiting_messages(redis_client, GENERATE_QUEUE) == 1
    assert not redis_client.exists("unacked_mutex")  # the restore lock was given up
    channel.qos.restore_at_shutdown = False
    kombu_calls.release(connection)


def test_a_restore_lock_taken_over_by_another_consumer_is_left_to_it(
    scriptless_url: str, redis_client: redis.Redis
) -> None:
    first = RedisWithoutLuaLocks.from_url(scriptless_url).lock("unacked_mutex", timeout=LOCK_S)
    assert first.acquire(blocking=False)
    redis_client.delete("unacked_mutex")  # it ran out
    second = RedisWithoutLuaLocks.from_url(scriptless_url).lock("unacked_mutex", timeout=LOCK_S)
    assert second.acquire(blocking=False)

    with pytest.raises(LockNotOwnedError):
        first.release()

    assert redis_client.exists("unacked_mutex")
    second.release()
    assert not redis_client.exists("unacked_mutex")


def test_a_binding_table_no_consumer_refreshed_is_swept_and_a_refreshed_one_stays(
    scriptless_url: str, redis_client: redis.Redis
) -> None:
    connection = kombu_calls.connect(scriptless_url, transport=TRANSPORT_PATH)
    for name in ("abandoned", "alive"):
        kombu_calls.declare(expiring_queue(name, connection))
    assert redis_client.exists(table("abandoned"), table("alive")) == 2
    redis_client.zadd(DEADLINES, {"abandoned": 0})  # nobody refreshed it in time

    swept = kombu_calls.sweep_bindings(connection)

    assert swept == 1
    assert not redis_client.exists(table("abandoned"))
    assert redis_client.exists(table("alive")) and redis_client.zscore(DEADLINES, "alive")
    kombu_calls.release(connection)


def test_an_overdue_table_that_a_queue_without_expiry_binds_is_kept(
    scriptless_url: str, redis_client: redis.Redis
) -> None:
    connection = kombu_calls.connect(scriptless_url, transport=TRANSPORT_PATH)
    kombu_calls.declare(expiring_queue("shared", connection))
    lasting = kombu_calls.queue(
        "lasting", kombu_calls.exchange("shared", type="direct"), routing_key="lasting", channel=connection
    )
    kombu_calls.declare(lasting)
    redis_client.zadd(DEADLINES, {"shared": 0})

    kombu_calls.sweep_bindings(connection)

    assert redis_client.exists(table("shared"), permanent("shared")) == 2
    assert redis_client.zscore(DEADLINES, "shared") is None
    kombu_calls.release(connection)
