"""The workers' Redis client, with the one retry layer for the worker -> Redis hop.

A Redis restart takes seconds (AOF reload included). A completion finished meanwhile must not be
thrown away because its hand-over failed once: every command is retried on a connection error with
jittered exponential backoff for about half a minute before the error reaches the task (which then
hands the batch back). Replaying a command is safe: every protocol step is idempotent (see
workers/state/protocol.py), and a replayed commit is refused by its part number.
"""

from __future__ import annotations

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

REDIS_RETRIES = 16
REDIS_BACKOFF_BASE_S = 0.1
REDIS_BACKOFF_CAP_S = 4.0  # 16 tries at up to 4 s each: ~30 s of outage on average, ~60 s at most
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


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        retry=Retry(
            ExponentialWithJitterBackoff(base=REDIS_BACKOFF_BASE_S, cap=REDIS_BACKOFF_CAP_S), REDIS_RETRIES
        ),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )
