"""A Redis restart is not a worker's end: each worker rides out ten of them under load and keeps consuming,
and logs each as a line or two, not a traceback.

kombu's Redis transport can end a Celery worker when the broker goes away under it (it restores unacked
messages over a channel whose connection it has already dropped), and under `honcho start` one exited
process tears down the whole node. Here the same processes must finish the run that ten restarts cut
into, with the README's defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from devstack.local_stack import free_port, start_redis, wait_until
from inference.simulator import SimulatorProcess
from tests.support import prompt_files
from tests.support.stack import README_WORKER_ENV, Stack, simulators_running
from workers.state.ledger import RunLedger

pytestmark = pytest.mark.integration

RESTARTS = 10
PROMPTS = 640  # 20 batches of 32: each worker holds batches through every restart
SPEEDUP = 10.0  # a request lasts a few seconds, the run a few minutes without faults
PROGRESS_BETWEEN_RESTARTS = 20  # completions handed over between two restarts: the workers consume again
PROGRESS_S = 120.0
FINISH_S = 420.0


@pytest.fixture
def sims() -> Iterator[list[SimulatorProcess]]:
    with simulators_running(2, speedup=SPEEDUP, request_log_size=20_000) as running:
        yield running


def handed_over(ledger: RunLedger) -> int:
    counts = ledger.counts()
    return counts.staged + counts.done


def progressed(ledger: RunLedger, target: int) -> Callable[[], bool]:
    return lambda: handed_over(ledger) >= target or ledger.counts().remaining == 0


def test_workers_ride_out_ten_redis_restarts_under_load_and_finish_the_run_themselves(
    sims: list[SimulatorProcess], log_dir: Path, tmp_path: Path
) -> None:
    # Given two generate workers and the uploader, with the README's defaults, on a Redis of their own
    port = free_port()
    server = start_redis(port, tmp_path / "redis-data", log_dir / "redis-0")
    stack = Stack(server.url, log_dir, sims, extra_env=README_WORKER_ENV)
    try:
        stack.start()
        processes = [*stack.generators, stack.uploader]
        pids = {process.name: process.pid for process in processes if process is not None}
        rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(PROMPTS, "r")]
        data = prompt_files.write_jsonl(tmp_path / "prompts.jsonl", rows)
        stack.enqueue(data, "reconnect", "--output", str(tmp_path / "out"))
        ledger = RunLedger(redis.Redis.from_url(server.url), "reconnect")

        # When Redis is restarted ten times while they work, each time after they made progress
        for restart in range(1, RESTARTS + 1):
            wait_until(
                progressed(ledger, handed_over(ledger) + PROGRESS_BETWEEN_RESTARTS),
                timeout_s=PROGRESS_S,
                what=f"progress before restart {restart} (the workers consume again)",
            )
            exited = [p.name for p in processes if p is not None and not p.alive()]
            assert not exited, f"{exited} exited after restart {restart - 1}:\n" + "\n".join(
                f"--- {p.name}\n{p.log_tail()}" for p in processes if p is not None
            )
            server.stop()
            server = start_redis(port, tmp_path / "redis-data", log_dir / f"redis-{restart}")
            ledger = RunLedger(redis.Redis.from_url(server.url), "reconnect")

        # Then the same processes finish the run, every prompt committed once
        stack.wait_finished("reconnect", timeout_s=FINISH_S)
        assert stack.verify("reconnect").returncode == 0
        ids = [row["prompt_id"] for row in stack.committed_rows("reconnect")]
        assert len(ids) == PROMPTS and len(set(ids)) == PROMPTS
        survivors = {p.name: p.pid for p in processes if p is not None and p.alive()}
        assert survivors == pids, "a worker exited and was not the one that started the run"
        # And each restart was a few lines in each worker's log, never a traceback
        for process in processes:
            assert process is not None
            assert "Traceback" not in process.log_path.read_text(errors="replace"), process.name
    finally:
        stack.stop()
        server.stop()
