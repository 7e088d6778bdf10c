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
(workers/state/broker_without_lua.py), so a consumer's Redis user needs no EVAL.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import redis.exceptions
from kombu import transport as kombu_transports
from kombu.transport import redis as kombu_redis

from workers.state.broker_without_lua import RedisWithoutLuaLocks, RefreshBinding, SweepBindings

TRANSPORT_PATH = "workers.state.broker_transport:Transport"
REDIS_SCHEMES = ("redis", "rediss")


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        remembered: dict[bool, dict[str, Any]] = self.__dict__.setdefault("_draftgen_connparams", {})
        if self.connection is not None and self.connection.client is not None:
            params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
            remembered[asynchronous] = dict(params)
            return params
        if asynchronous in remembered:
            return dict(remembered[asynchronous])
        raise redis.exceptions.ConnectionError("the broker connection closed before this channel connected")

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


class Transport(kombu_redis.Transport):
    Channel = Channel


def use_for_redis_urls() -> None:
    """Make `redis://` and `rediss://` URLs mean this transport in this process (the Celery app, and
    Flower, which picks its broker view by the URL's scheme and so needs the scheme kept)."""
    for scheme in REDIS_SCHEMES:
        kombu_transports.TRANSPORT_ALIASES[scheme] = TRANSPORT_PATH
        kombu_transports._transport_cache.pop(scheme, None)
