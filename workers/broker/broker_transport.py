"""kombu's Redis transport, made to survive its own close after a broker restart.

When Redis goes away under a worker, Celery closes the broker connection and then its channels. kombu
drops the channel's link to the connection settings first (`Transport.client = None`) and only then,
closing the channel, restores its unacked messages through a pool it rebuilds from those settings:
`AttributeError: 'NoneType' object has no attribute 'hostname'`. That is not a connection error, so
Celery does not retry the connection: the worker exits (kombu 5.7.0). Under `honcho start` one exited
process tears down the whole node.

Here the channel remembers the parameters it connected with while the link is there and rebuilds its
pool from them after. The unacked messages go back to their queue if Redis is up again; if it is not,
the failure is a `redis.exceptions.ConnectionError`, which Celery's reconnect loop absorbs (the messages
then come back through the visibility timeout, as they would after a kill).

And the channel runs no Lua: what kombu does through scripts is done with plain commands
(workers/broker/broker_without_lua.py), so a consumer's Redis user needs no EVAL.

And no message ends a consumer. kombu decodes what it pops and delivers it, trusting every byte: one
malformed item on a queue, in the `unacked` hash or on a channel raised out of the event loop and ended
the worker. Here every item is checked from its raw bytes (workers/broker/message_check.py) where kombu
would decode it (`_brpop_read`, `_get`, `_receive_one`, and restoring an unacked message); one that
fails is parked (workers/broker/parked_messages.py) and the consumer reads on. The item is already off
its list then, so parking it loses nothing. A broadcast, a reply or an event (nothing to acknowledge)
that passes the check but that its consumer raises on is parked too; a task message is checked whole,
so Celery gets only what draftgen sends. Errors of the connection itself still reach Celery's reconnect.
These methods are kombu 5.7.0's, each changed only where the item is decoded
(tests/unit/test_broker_transport.py fails if kombu's change).
"""

from __future__ import annotations

import time
from functools import cached_property
from queue import Empty
from typing import Any
from urllib.parse import urlsplit

import redis.exceptions
from kombu import transport as kombu_transports
from kombu.transport import redis as kombu_redis
from redis.sentinel import Sentinel

from workers.broker.broker_without_lua import RedisWithoutLuaLocks, RefreshBinding, SweepBindings
from workers.broker.message_check import Malformation, read_queue_item, read_unacked_entry
from workers.broker.parked_messages import UNACKED_QUEUE, ParkedMessage, park_or_drop, parked_message
from workers.errors import MalformedMessage
from workers.state.queues import KOMBU_PRIORITY_STEPS, TASK_OF_QUEUE
from workers.state.redis_address import DEFAULT_SENTINEL_PORT, SENTINEL_SCHEME
from workers.state.sentinel_connection import PrimaryConnection, PrimarySSLConnection

TRANSPORT_PATH = "workers.broker.broker_transport:Transport"
SENTINEL_TRANSPORT_PATH = "workers.broker.broker_transport:SentinelTransport"
REDIS_SCHEMES = ("redis", "rediss")
CLOSED_BEFORE_CONNECTED = "the broker connection closed before this channel connected"


class QoS(kombu_redis.QoS):
    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        channel: Channel = self.channel
        malformed: list[ParkedMessage] = []

        def restore_transaction(pipe: Any) -> None:
            raw = pipe.hget(self.unacked_key, tag)
            pipe.multi()
            self._remove_from_indices(tag, pipe)  # type: ignore[no-untyped-call]
            malformed[:] = channel._restore_entry(raw, pipe, leftmost) if raw else []

        with channel.conn_or_acquire(client) as connected:
            connected.transaction(restore_transaction, self.unacked_key)
        channel._park_all(malformed)


class Channel(kombu_redis.Channel):
    QoS = QoS
    priority_steps = list(KOMBU_PRIORITY_STEPS)  # noqa: RUF012  # kombu's attribute: a list per priority (queues.py)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        remembered: dict[bool, dict[str, Any]] = self.__dict__.setdefault("_draftgen_connparams", {})
        if self.connection is not None and self.connection.client is not None:
            params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
            remembered[asynchronous] = dict(params)
            return params
        if asynchronous in remembered:
            return dict(remembered[asynchronous])
        raise redis.exceptions.ConnectionError(CLOSED_BEFORE_CONNECTED)

    def _get_client(self) -> Any:
        stock = super()._get_client()  # type: ignore[no-untyped-call]  # also checks redis-py's version
        return stock if self.global_keyprefix else RedisWithoutLuaLocks

    @cached_property
    def _refresh_binding(self) -> RefreshBinding:
        return RefreshBinding(self.conn_or_acquire)

    @cached_property
    def _sweep_bindings(self) -> SweepBindings:
        return SweepBindings()

    def close(self) -> None:
        super().close()  # type: ignore[no-untyped-call]
        self._disconnect_pools()  # type: ignore[no-untyped-call]  # the pool a late restore of unacked messages rebuilt

    def _brpop_read(self, **options: Any) -> bool:
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            if dest__item:
                dest, item = dest__item
                dest = _text(dest).rsplit(self.sep, 1)[0]
                self._queue_cycle.rotate(dest)
                message = self._checked(item, dest)
                if message is None:
                    raise Empty()
                self._deliver_checked(message, dest, item)
                return True
            else:
                raise Empty()
        finally:
            self._in_poll = None  # type: ignore[assignment]
            self._flush_brpop_reauth()  # type: ignore[no-untyped-call]

    def _get(self, queue: str, timeout: Any = None) -> dict[str, Any]:
        with self.conn_or_acquire() as client:
            for pri in self.priority_steps:
                item = client.rpop(self._q_for_pri(queue, pri))  # type: ignore[no-untyped-call]
                if item:
                    self._maybe_update_queues_expire(client, queue)  # type: ignore[no-untyped-call]
                    message = self._checked(item, queue)
                    if message is None:
                        raise Empty()
                    return message

            self._maybe_update_queues_expire(client, queue)  # type: ignore[no-untyped-call]
            raise Empty()

    def _receive_one(self, c: Any) -> bool | None:
        response = None
        try:
            response = c.parse_response()
        except self.connection_errors:
            self._in_listen = None  # type: ignore[assignment]
            raise
        if isinstance(response, (list, tuple)):
            payload = self._handle_message(c, response)  # type: ignore[no-untyped-call]
            if _text(payload["type"]).endswith("message"):
                channel = _text(payload["channel"])
                if payload["data"]:
                    if channel[0] == "/":
                        _, _, channel = channel.partition(".")
                    queue = self._fanout_to_queue.get(channel.split("/", 1)[0])
                    return queue is not None and self._deliver_heard(payload["data"], queue)
        return None

    def _deliver_heard(self, raw: bytes, queue: str) -> bool:
        """A message heard on a channel this process listens to, for the queue of that channel."""
        message = self._checked(raw, queue)
        if message is None:
            return False
        self._deliver_checked(message, queue, raw)
        return True

    def _restore(self, message: Any, leftmost: bool = False) -> None:
        if not self.ack_emulation:
            super()._restore(message)  # type: ignore[no-untyped-call]
            return
        tag = message.delivery_tag
        malformed: list[ParkedMessage] = []

        def restore_transaction(pipe: Any) -> None:
            raw = pipe.hget(self.unacked_key, tag)
            pipe.multi()
            pipe.hdel(self.unacked_key, tag)
            malformed[:] = self._restore_entry(raw, pipe, leftmost) if raw else []

        with self.conn_or_acquire() as client:
            client.transaction(restore_transaction, self.unacked_key)
        self._park_all(malformed)

    def _restore_entry(self, raw: bytes, pipe: Any, leftmost: bool) -> list[ParkedMessage]:
        """Give an unacked message back to its queue, or (malformed) what to park once the transaction ran."""
        try:
            envelope, exchange, routing_key = read_unacked_entry(raw)
        except MalformedMessage as malformed:
            return [parked_message(raw, UNACKED_QUEUE, malformed, at=time.time())]
        self._do_restore_message(envelope, exchange, routing_key, pipe, leftmost)  # type: ignore[no-untyped-call]
        return []

    def _checked(self, raw: bytes, queue: str) -> dict[str, Any] | None:
        """The item's envelope, checked; None once a malformed one is parked."""
        try:
            return read_queue_item(raw, queue)
        except MalformedMessage as malformed:
            self._park_all([parked_message(raw, queue, malformed, at=time.time())])
            return None

    def _deliver_checked(self, message: dict[str, Any], queue: str, raw: bytes) -> None:
        if queue in TASK_OF_QUEUE:  # checked whole: Celery acknowledges it, or gives it back
            self.connection._deliver(message, queue)
            return
        try:
            self.connection._deliver(message, queue)
        except self._io_errors:
            raise
        except Exception as error:  # a broadcast, reply or event: nothing to acknowledge, nothing lost
            failed = MalformedMessage(Malformation.CONSUMER_FAILED, f"{type(error).__name__}: {error}")
            self._park_all([parked_message(raw, queue, failed, at=time.time())])

    @cached_property
    def _io_errors(self) -> tuple[type[BaseException], ...]:
        """The connection's own errors: kombu counts a KeyError among them, which a consumer raises too."""
        return tuple(error for error in self.connection_errors if error is not KeyError)

    def _park_all(self, parked: list[ParkedMessage]) -> None:
        for record in parked:
            with self.conn_or_acquire() as client:
                park_or_drop(client, record)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """The same channel on the primary a set of Sentinels names (kombu's Sentinel channel underneath: its
    pool asks them for the primary on each new connection, so a failover is followed by reconnecting).
    Like the connection settings, the Sentinels' addresses are remembered for a pool rebuilt after the
    connection closed. Its connections ask the Sentinels on every connect, a retry's included, as the
    state client's do (workers/state/sentinel_connection.py)."""

    connection_class = PrimaryConnection
    connection_class_ssl = PrimarySSLConnection

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        params = self._connparams(asynchronous)
        sentinels = self.__dict__.setdefault("_draftgen_sentinels", [])
        if self.connection is not None and self.connection.client is not None:
            sentinels[:] = self._sentinels_of(self.connection.client.alt, params)
        if not sentinels:
            raise redis.exceptions.ConnectionError(CLOSED_BEFORE_CONNECTED)
        login = {key: params[key] for key in ("username", "password") if params.get(key) is not None}
        options = {key: value for key, value in params.items() if key not in ("host", "port")}
        manager = Sentinel(list(sentinels), sentinel_kwargs=getattr(self, "sentinel_kwargs", None), **options)
        if asynchronous:
            self._async_sentinel_manager = manager  # kombu's _disconnect_pools closes its connections
        else:
            self._sentinel_manager = manager
        master_name = getattr(self, "master_name", None)
        if master_name is None:
            raise ValueError("a Sentinel broker URL needs the master_name transport option")
        return manager.master_for(master_name, redis.Redis, **login).connection_pool

    def _sentinels_of(self, addresses: list[str], params: dict[str, Any]) -> list[tuple[str, int]]:
        found = [urlsplit(address) for address in addresses]
        sentinels = [
            (url.hostname, url.port or self.connection.default_port) for url in found if url.hostname
        ]
        return sentinels or [(params["host"], params["port"])]


class SentinelTransport(Transport):
    default_port = DEFAULT_SENTINEL_PORT  # type: ignore[assignment]  # kombu's base declares None
    Channel = SentinelChannel


def use_for_redis_urls() -> None:
    """Make `redis://`, `rediss://` and `sentinel://` URLs mean these transports in this process (the Celery
    app, and Flower, which picks its broker view by the URL's scheme and so needs the scheme kept)."""
    for scheme in REDIS_SCHEMES:
        kombu_transports.TRANSPORT_ALIASES[scheme] = TRANSPORT_PATH
        kombu_transports._transport_cache.pop(scheme, None)
    kombu_transports.TRANSPORT_ALIASES[SENTINEL_SCHEME] = SENTINEL_TRANSPORT_PATH
    kombu_transports._transport_cache.pop(SENTINEL_SCHEME, None)
