"""The workers' Redis client, with the one retry layer for the worker -> Redis hop.

A Redis restart takes seconds (AOF reload included). A completion finished meanwhile must not be
thrown away because its hand-over failed once: every command is retried on a connection error with
jittered exponential backoff for about half a minute before the error reaches the task (which then
hands the batch back). Replaying a command is safe: every protocol step is idempotent (see
workers/state/protocol.py), and a replayed commit is refused by its part number.

A worker that is stopping has no half minute per command: its shutdown grace is for the requests in
flight, and every key it would tidy (lease, seat, heartbeat) expires by itself. `retry_briefly` shortens
the client's one policy to a few quick tries, commands retrying at that moment included, so a SIGTERM with
Redis down ends within the grace.
"""

from __future__ import annotations

import random
from typing import Any

import redis
from redis.backoff import AbstractBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from workers.state.redis_address import SentinelAddress, is_sentinel_url, sentinel_address
from workers.state.sentinel_connection import primary_connection_class

REDIS_RETRIES = 16
REDIS_BACKOFF_BASE_S = 0.1
REDIS_BACKOFF_CAP_S = 4.0  # 16 tries at up to 4 s each: ~30 s of outage on average, ~60 s at most
REDIS_CONNECT_TIMEOUT_S = 5.0  # a host that drops packets fails a try in this, not in the OS's 2 minutes
REDIS_SOCKET_TIMEOUT_S = 10.0
"""A reply this late comes from a primary frozen or cut off, whose connections no reset or FIN closes: the
command's try fails and its retry connects anew, asking the Sentinels where the primary is. Every call of
draftgen's is a short one (no blocking command on these clients), so a live server answers in milliseconds."""
STOPPING_RETRIES = 2
STOPPING_BACKOFF_CAP_S = 0.5
SENTINEL_TIMEOUT_S = 2.0  # a Sentinel answers at once; a dead one is passed over for the next
MICROSECONDS_PER_S = 1e6
SCAN_COUNT = 1000


def values_matching(client: redis.Redis, pattern: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the string keys matching `pattern`, sorted by key (keys gone meanwhile: none)."""
    keys = sorted(client.scan_iter(match=pattern, count=SCAN_COUNT))
    if not keys:
        return []
    return [(key, value) for key, value in zip(keys, client.mget(keys), strict=True) if value is not None]


def redis_now_s(client: redis.Redis) -> float:
    """Redis's clock, the one the protocol's scripts stamp with (hosts' clocks may disagree)."""
    seconds, microseconds = client.time()
    return float(seconds) + float(microseconds) / MICROSECONDS_PER_S


class JitteredBackoff(AbstractBackoff):  # type: ignore[misc]  # redis ships no types for it
    """Full jitter over an exponential ceiling whose cap can be lowered while it is in use."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        self.base_s = base_s
        self.cap_s = cap_s

    def reset(self) -> None:
        pass

    def compute(self, failures: int) -> float:
        return random.uniform(0, min(self.cap_s, self.base_s * 2**failures))


class ShortenableRetry(Retry):  # type: ignore[misc]
    """The client's one retry policy: every connection shares it (redis-py deep-copies a policy into each
    connection; this one copies as itself), so shortening it reaches the commands retrying right now."""

    def __init__(self) -> None:
        self.backoff = JitteredBackoff(REDIS_BACKOFF_BASE_S, REDIS_BACKOFF_CAP_S)
        super().__init__(self.backoff, REDIS_RETRIES, (redis.ConnectionError, redis.TimeoutError))

    def __deepcopy__(self, memo: dict[int, Any]) -> ShortenableRetry:
        return self

    def shorten(self) -> None:
        self.backoff.cap_s = STOPPING_BACKOFF_CAP_S
        self.update_retries(STOPPING_RETRIES)


def client_for(url: str, **options: Any) -> redis.Redis:
    """A client of the Redis `url` names (workers/state/redis_address.py): one server, or the primary its
    Sentinels name, asked again on each new connection, so a failover is followed without a restart (a
    connection to the old primary fails, or finds it a read-only replica, and the next one asks)."""
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **options)
    address = sentinel_address(url)
    # The timeouts are the Sentinels' own: the primary's connections get the caller's `options`, as a
    # server's URL would (a Sentinel's keyword arguments beside sentinel_kwargs go to the primary's).
    sentinels = Sentinel(list(address.sentinels), sentinel_kwargs=sentinel_kwargs(address))
    login = {"db": address.db, "username": address.username, "password": address.password}
    return sentinel_client(sentinels, address.master_name, tls=address.tls_options(), **login, **options)


def sentinel_client(
    sentinels: Any, master_name: str, *, tls: dict[str, Any] | None = None, **options: Any
) -> redis.Redis:
    """A client of the primary `sentinels` (a redis-py Sentinel) name, asked again on every connect, a
    retry's included (workers/state/sentinel_connection.py); over TLS with `tls`'s options."""
    connection_class = primary_connection_class(tls is not None)
    pool = SentinelConnectionPool(
        master_name, sentinels, connection_class=connection_class, **(tls or {}), **options
    )
    return redis.Redis.from_pool(pool)


def sentinel_kwargs(address: SentinelAddress) -> dict[str, Any]:
    """How a Sentinel of `address` is asked: briefly (a dead one is passed over), over TLS and with the
    login if the URL says."""
    return {
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        **address.ssl_kwargs(),
        **address.sentinel_login(),
    }


def no_primary_reason(error: redis.RedisError) -> str | None:
    """What a Sentinel URL's failure to name a primary means, in one line (redis-py's message carries each
    Sentinel client's whole repr); None for any other error."""
    if not isinstance(error, MasterNotFoundError):
        return None
    head, unreachable, _ = str(error).partition(" : ")
    if unreachable:
        return f"{head}: no Sentinel of the URL answered"
    return f"{head}: its Sentinels know no primary by that name that is up"


def connect(url: str) -> redis.Redis:
    return client_for(url, **retrying_options())


def retrying_options() -> dict[str, Any]:
    """A worker's client options: its one retry policy, on connection errors and timeouts."""
    return {
        "retry": ShortenableRetry(),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S,
        "socket_timeout": REDIS_SOCKET_TIMEOUT_S,
    }


def retry_briefly(client: redis.Redis) -> None:
    """From now on every command of this client, those retrying now included, tries only a few times."""
    retry = client.get_retry()
    if isinstance(retry, ShortenableRetry):
        retry.shorten()
