"""`status` tells the truth about work a killed worker held: its GPU's row says the worker is dead, the
batches it held are shown as held by a dead worker with when and how they come back, never as lost, and
a worker started again on that GPU takes them back at once. A dead server's batches do not wait for a
lease to run out: its worker hands them back within seconds, for the other GPUs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from devstack.local_stack import free_port, start_redis, wait_until
from tests.support import prompt_files
from tests.support.stack import README_WORKER_ENV, Stack, simulators_running
from workers.state.keys import RunKeys

pytestmark = pytest.mark.integration

RUN = "held"
PROMPTS = 600
SPEEDUP = 10.0  # requests last seconds: the killed worker holds batches when it dies
DEAD_SEEN_S = 30.0  # its heartbeat goes stale within two beats (10 s)
TAKEN_BACK_S = 30.0
SERVER_DEATH_HANDBACK_S = 20.0  # refused requests hand a batch back at once; liveness says "down" in 15 s


@pytest.fixture
def stack(tmp_path: Path, log_dir: Path) -> Iterator[Stack]:
    server = start_redis(free_port(), tmp_path / "redis-data", log_dir / "redis")
    with simulators_running(2, speedup=SPEEDUP) as sims:
        running = Stack(server.url, log_dir, sims, extra_env=README_WORKER_ENV)
        try:
            yield running.start()
        finally:
            running.stop()
            server.stop()


def status(stack: Stack) -> dict[str, Any]:
    result = stack.producer("status", "--run", RUN, "--json")
    assert result.returncode == 0, result.stderr
    decoded: dict[str, Any] = json.loads(result.stdout)
    return decoded


def held_by(stack: Stack, worker: str) -> dict[str, Any]:
    """The batches `worker` holds, as status's JSON gives them; {} when it holds none."""
    return next((work for work in status(stack)["held"] if work["worker"] == worker), {})


def test_a_killed_workers_batches_are_shown_held_by_a_dead_worker_and_come_back(
    stack: Stack, tmp_path: Path
) -> None:
    rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(PROMPTS, "h")]
    stack.enqueue(
        prompt_files.write_jsonl(tmp_path / "p.jsonl", rows), RUN, "--output", str(tmp_path / "out")
    )
    client = redis.Redis.from_url(stack.redis_url)
    wait_until(lambda: client.zcard(RunKeys(RUN).leases) >= 4, timeout_s=60, what="both GPUs holding batches")
    gpus = [row["worker"] for row in status(stack)["gpus"]]
    killed_gpu = next(gpu for gpu in gpus if gpu.endswith("gpu0"))
    wait_until(lambda: bool(held_by(stack, killed_gpu)), timeout_s=60, what="gpu0 holding batches")

    # When gpu0's worker is killed
    stack.generators[0].kill()

    # Then its row says dead, and its batches are held by a dead worker, with when they come back
    wait_until(lambda: held_by(stack, killed_gpu).get("life") == "dead", timeout_s=DEAD_SEEN_S, what="dead")
    seen = status(stack)
    [row] = [row for row in seen["gpus"] if row["worker"] == killed_gpu]
    assert row["life"] == "dead"
    assert not any("nothing will generate them" in warning for warning in seen["warnings"])
    text = " ".join(stack.producer("status", "--run", RUN).stdout.split())  # the lines as one
    assert f"{killed_gpu}: " in text and "held by a dead worker, not lost" in text
    assert "taken back at once by a worker that starts on" in text

    # And a worker started again on that GPU takes them back at once
    stack.generators[0] = stack.start_generator(0)
    wait_until(
        lambda: held_by(stack, killed_gpu).get("life") in (None, "alive"),
        timeout_s=TAKEN_BACK_S,
        what="its batches taken back by the new worker",
    )
    stack.wait_finished(RUN, timeout_s=240)
    assert stack.verify(RUN).returncode == 0


def test_a_dead_servers_batches_go_back_within_seconds_not_after_a_lease(
    stack: Stack, tmp_path: Path
) -> None:
    rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(PROMPTS, "s")]
    stack.enqueue(
        prompt_files.write_jsonl(tmp_path / "p.jsonl", rows), RUN, "--output", str(tmp_path / "out")
    )
    gpu0 = next(gpu for gpu in (row["worker"] for row in status(stack)["gpus"]) if gpu.endswith("gpu0"))
    wait_until(lambda: held_by(stack, gpu0).get("batches", 0) >= 2, timeout_s=60, what="gpu0 holding batches")

    # When gpu0's server dies (its worker lives on)
    stack.sims[0].kill()

    # Then its worker hands its batches back within seconds, far within a lease (60 s), for gpu1 to take
    wait_until(
        lambda: not held_by(stack, gpu0), timeout_s=SERVER_DEATH_HANDBACK_S, what="gpu0's batches back"
    )
    wait_until(
        lambda: held_by(stack, gpu0.replace("gpu0", "gpu1")).get("batches", 0) > 0,
        timeout_s=SERVER_DEATH_HANDBACK_S,
        what="gpu1 taking batches",
    )
