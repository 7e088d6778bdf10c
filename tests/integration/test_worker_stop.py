"""A worker told to stop while Redis is down stops within its shutdown grace, saying each problem in one line.

Every key a stopping worker would tidy (its lease, its GPU's seat, its heartbeat) expires by itself, so
with Redis gone there is nothing to wait for: before, each of those last Redis calls retried for half a
minute and a SIGTERM took minutes, with a Celery traceback per retry. Run with the README's defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devstack.local_stack import ManagedProcess, free_port, start_celery_worker, start_redis, wait_until
from inference.simulator import SimulatorProcess
from tests.support.stack import simulators_running
from workers.settings import DEFAULT_SHUTDOWN_GRACE_S
from workers.state.keys import WORKER_HEARTBEAT_PATTERN

pytestmark = pytest.mark.integration

HEARTBEAT_S = 30.0
SIGTERM_MARK = "--- SIGTERM sent here ---"


@pytest.fixture
def sims() -> Iterator[list[SimulatorProcess]]:
    with simulators_running(1) as running:
        yield running


def sigterm_with_redis_down(worker: ManagedProcess, server: ManagedProcess) -> str:
    """Stop Redis, SIGTERM the worker, wait no longer than the grace; what the worker logged after."""
    server.stop()
    with worker.log_path.open("a") as log:
        log.write(f"\n{SIGTERM_MARK}\n")
    worker.stop(timeout_s=DEFAULT_SHUTDOWN_GRACE_S)
    return worker.log_text().split(SIGTERM_MARK, 1)[1]


@pytest.mark.parametrize("queue", ["generate", "upload"])
def test_a_worker_stopped_with_redis_down_exits_within_the_grace_in_single_lines(
    queue: str, sims: list[SimulatorProcess], log_dir: Path, tmp_path: Path
) -> None:
    # Given a worker at work on a Redis of its own
    server = start_redis(free_port(), tmp_path / "redis-data", log_dir / "redis")
    env = {"DRAFTGEN_REDIS_URL": server.url, "DRAFTGEN_SERVER_URL": sims[0].url, "DRAFTGEN_GPU": "0"}
    env["PYTHONUNBUFFERED"] = "1"
    worker = start_celery_worker(queue, queue, env, log_dir, concurrency=1 if queue == "upload" else None)
    try:
        if queue == "generate":
            client = redis.Redis.from_url(server.url)
            wait_until(
                lambda: bool(client.keys(WORKER_HEARTBEAT_PATTERN)), timeout_s=HEARTBEAT_S, what="beat"
            )
        # When Redis goes away and the worker is told to stop
        said = sigterm_with_redis_down(worker, server)
        # Then it is gone within its shutdown grace, and said what it could not do without a traceback
        assert worker.process is not None
        assert worker.process.returncode == 0, (
            f"not gone by itself {DEFAULT_SHUTDOWN_GRACE_S:.0f} s after SIGTERM"
        )
        assert "Traceback" not in said, said
    finally:
        worker.kill()
        server.stop()
