"""A connection to the primary a set of Sentinels names, that asks them again each time it connects.

redis-py's Sentinel connection asks the Sentinels when a command takes it from the pool, but a command
retried after its connection broke reconnects it to the address it had (redis-py issues 3560 and 3874,
open in 8.2): a command caught by a failover spends the whole retry policy on the dead primary and
fails, though the Sentinels named a new one seconds after. Asking on every socket connect, retries
included, sends the next try to the primary named by then (or retries while none is named yet).
"""

from __future__ import annotations

import socket
from typing import Any

from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection, SentinelManagedSSLConnection


class _AsksOnEveryConnect:
    connection_pool: SentinelConnectionPool
    host: str
    port: int
    _sock: socket.socket | None

    def _connect_retry(self) -> None:
        """redis-py's first connect, which asks the Sentinels before it opens the socket: for the primary
        the socket's own connect asks (below), so it is asked once, not twice."""
        if self._sock or not self.connection_pool.is_master:
            super()._connect_retry()  # type: ignore[misc]
            return
        check = self.connection_pool.check_connection
        self.connect_check_health(check_health=check, retry_socket_connect=False)  # type: ignore[attr-defined]

    def _connect(self) -> socket.socket:
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        sock: socket.socket = super()._connect()  # type: ignore[misc]
        return sock


class PrimaryConnection(_AsksOnEveryConnect, SentinelManagedConnection):  # type: ignore[misc]
    pass


class PrimarySSLConnection(_AsksOnEveryConnect, SentinelManagedSSLConnection):  # type: ignore[misc]
    pass


def primary_connection_class(tls: bool) -> type[Any]:
    return PrimarySSLConnection if tls else PrimaryConnection
