"""A command under way when its primary dies is retried on the primary the Sentinels name by then.

redis-py's Sentinel connection asks the Sentinels only when a command takes a connection from its pool;
a command retried on the same connection reconnected to the address it had, so a command caught by a
failover spent the client's whole retry budget (16 tries, ~25 s) on the dead primary and failed, though a
new one had been elected within seconds (redis-py issues 3560 and 3874). In the failover scenario that
was a finished batch's hand-over, whose lease then ran out a minute later. Two real servers here, and
Sentinels that name the first, then the second.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from redis.sentinel import MasterNotFoundError

from devstack.local_stack import (
    LOCAL_REDIS_HOST,
    REDIS_AUTH_CONF,
    RedisProcess,
    free_port,
    start_redis,
    wait_until,
)
from workers.state.redis_client import retrying_options, sentinel_client

pytestmark = pytest.mark.integration

MASTER = "draftgen"
QUESTIONS_UNTIL_ELECTED = 3
QUEUE = "generate"
WAIT_S = 60.0


def blocked_clients(server: RedisProcess) -> int:
    return int(redis.Redis.from_url(server.url).info("clients")["blocked_clients"])


class ElectingSentinels:
    """Stands in for redis-py's Sentinel manager: names the primary, and once told of a failover names
    none for a few questions (the primary judged down, the election) and then the new one."""

    def __init__(self, primary: RedisProcess) -> None:
        self.primary = primary
        self.next_primary: RedisProcess | None = None
        self.questions_until_elected = 0
        self.questions = 0

    def fail_over_to(self, primary: RedisProcess, *, after_questions: int) -> None:
        self.next_primary, self.questions_until_elected = primary, after_questions

    def discover_master(self, service_name: str) -> tuple[str, int]:
        self.questions += 1
        if self.next_primary is not None:
            self.questions_until_elected -= 1
            if self.questions_until_elected > 0:
                raise MasterNotFoundError(f"No master found for {service_name!r}")
            self.primary, self.next_primary = self.next_primary, None
        return LOCAL_REDIS_HOST, self.primary.port


def test_a_command_caught_by_a_failover_is_retried_on_the_new_primary(tmp_path: Path) -> None:
    # Given a client on the primary its Sentinels name, with the workers' retry policy
    old = start_redis(free_port(), tmp_path / "old", tmp_path)
    (tmp_path / "new").mkdir()
    shutil.copy(tmp_path / "old" / REDIS_AUTH_CONF, tmp_path / "new" / REDIS_AUTH_CONF)  # one password
    new = start_redis(free_port(), tmp_path / "new", tmp_path)
    try:
        sentinels = ElectingSentinels(old)
        client = sentinel_client(sentinels, MASTER, password=old.password, **retrying_options())
        waiting = ThreadPoolExecutor(max_workers=1)
        # When the primary dies while a command waits on it (a worker's BRPOP on its queue), and the
        # Sentinels elect the new one
        answer = waiting.submit(client.blpop, [QUEUE], timeout=WAIT_S)
        wait_until(lambda: blocked_clients(old) == 1, timeout_s=WAIT_S, what="the command to wait")
        redis.Redis.from_url(new.url).rpush(QUEUE, "on the new primary")
        old.kill()
        sentinels.fail_over_to(new, after_questions=QUESTIONS_UNTIL_ELECTED)
        # Then the command, retried on its broken connection, is answered by the new primary
        assert answer.result(timeout=WAIT_S) == (QUEUE.encode(), b"on the new primary")
        assert sentinels.next_primary is None  # elected on the way
        waiting.shutdown()
    finally:
        old.stop()
        new.stop()


def test_a_new_connection_asks_the_sentinels_once(tmp_path: Path) -> None:
    primary = start_redis(free_port(), tmp_path / "primary", tmp_path)
    try:
        sentinels = ElectingSentinels(primary)
        client = sentinel_client(sentinels, MASTER, password=primary.password, **retrying_options())
        client.set("written", "once")
        assert sentinels.questions == 1
    finally:
        primary.stop()
