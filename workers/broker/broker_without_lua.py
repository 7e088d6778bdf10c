"""What kombu's Redis transport does through Lua, done with plain commands, so that a consumer's Redis user
needs neither EVAL, EVALSHA nor SCRIPT LOAD (deploy/redis-users.acl gives the workers FCALL of draftgen's
own functions only).

kombu 5.7 runs three scripts on a consumer's behalf:
- redis-py's lock release (GET, then DEL while the token is still ours) for `unacked_mutex`, which lets
  one consumer at a time give back the messages past their visibility timeout;
- REFRESH_BINDING, for a queue declared with x-expires (Celery's remote-control and event queues): the
  binding joins its exchange's table, and the exchange's deadline rises to now + TTL by Redis's clock;
- SWEEP_BINDINGS: a table whose deadline passed and that no permanent binding holds is deleted.

Here the lock is released and an overdue table swept in a transaction that watches what it judged (a
refresh or a new lock holder in between makes it judge again), and a refresh raises the deadline before
it adds the binding: a sweep that saw the old deadline then finds the key it watched changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import redis
from redis.client import Pipeline
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

MS_PER_S = 1000
US_PER_MS = 1000

ClientSource = Callable[[], AbstractContextManager[redis.Redis]]


class WatchReleasedLock(Lock):  # type: ignore[misc]  # redis-py is not followed (pyproject.toml)
    """redis-py's lock, released by a transaction instead of its Lua script."""

    def do_release(self, expected_token: bytes) -> None:
        self.redis.transaction(partial(self._delete_if_ours, expected_token), self.name)

    def _delete_if_ours(self, expected_token: bytes, pipe: Pipeline) -> None:
        stored = pipe.get(self.name)
        if stored is None or self.redis.get_encoder().encode(stored) != expected_token:
            raise LockNotOwnedError("Cannot release a lock that's no longer owned", lock_name=self.name)
        pipe.multi()
        pipe.delete(self.name)


class RedisWithoutLuaLocks(redis.Redis):  # type: ignore[misc]  # redis-py is not followed
    """The client kombu's channel makes: its locks need no script."""

    def lock(self, name: str, *args: Any, **kwargs: Any) -> Lock:
        kwargs["lock_class"] = WatchReleasedLock
        return super().lock(name, *args, **kwargs)


def redis_now_ms(client: redis.Redis) -> int:
    seconds, microseconds = client.time()
    return int(seconds) * MS_PER_S + int(microseconds) // US_PER_MS


class RefreshBinding:
    """REFRESH_BINDING: KEYS binding table, deadlines; ARGV binding, exchange, TTL ms."""

    def __init__(self, plain_client: ClientSource) -> None:
        self._plain_client = plain_client  # for Redis's clock when the caller hands a pipeline

    def __call__(self, keys: Sequence[str], args: Sequence[Any], client: redis.Redis | Pipeline) -> None:
        table, deadlines = keys
        binding, exchange, ttl_ms = args
        with self._plain_client() as plain:
            deadline_ms = redis_now_ms(plain) + int(ttl_ms)
        client.zadd(deadlines, {exchange: deadline_ms}, gt=True)
        client.sadd(table, binding)


class SweepBindings:
    """SWEEP_BINDINGS: KEYS deadlines; ARGV table prefix, permanent-set prefix, the most tables to judge.
    Returns how many were overdue."""

    def __call__(self, keys: Sequence[str], args: Sequence[Any], client: redis.Redis) -> int:
        (deadlines,) = keys
        table_prefix, permanent_prefix, limit = args
        now_ms = redis_now_ms(client)
        overdue = client.zrangebyscore(deadlines, "-inf", now_ms, start=0, num=int(limit))
        for raw in overdue:
            exchange = raw.decode() if isinstance(raw, bytes) else str(raw)
            table, permanent = table_prefix + exchange, permanent_prefix + exchange
            sweep = partial(_sweep_one, deadlines, exchange, table, permanent, now_ms)
            client.transaction(sweep, deadlines, table, permanent)
        return len(overdue)


def _sweep_one(
    deadlines: str, exchange: str, table: str, permanent: str, now_ms: int, pipe: Pipeline
) -> None:
    """Under WATCH of the three keys: the table goes unless refreshed since or held by a permanent binding."""
    deadline = pipe.zscore(deadlines, exchange)
    if deadline is None or deadline > now_ms:
        return
    held = bool(pipe.exists(permanent))
    pipe.multi()
    if not held:
        pipe.delete(table)
    pipe.zrem(deadlines, exchange)
