"""The Procfiles describe one whole node: a server and a generate worker per GPU, the uploader, Flower;
Procfile on 7 real GPUs, Procfile.simulated on two simulated ones. Every process but Redis is kept up by
scripts/respawn, so one that dies is replaced and the node goes on."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from honcho.environ import parse_procfile

from devstack.local_stack import PROJECT_ROOT
from node.settings import DEFAULT_STREAM_INTERVAL_TOKENS

PROCESSES = parse_procfile((PROJECT_ROOT / "Procfile").read_text()).processes
SIMULATED = parse_procfile((PROJECT_ROOT / "Procfile.simulated").read_text()).processes
RESPAWN = "scripts/respawn "


def test_every_gpu_has_a_server_and_a_generate_worker_pointed_at_it() -> None:
    servers = {
        int(re.search(r"--gpu (\d+)", cmd).group(1))  # type: ignore[union-attr]  # None fails the test
        for name, cmd in PROCESSES.items()
        if name.startswith("sglang")
    }
    workers = {
        int(re.search(r"DRAFTGEN_GPU=(\d+)", cmd).group(1))  # type: ignore[union-attr]  # None fails the test
        for name, cmd in PROCESSES.items()
        if name.startswith("gen")
    }
    assert servers == workers == set(range(7))
    assert all("-Q generate" in cmd for name, cmd in PROCESSES.items() if name.startswith("gen"))


def test_every_process_but_redis_is_started_again_when_it_dies_in_both_recipes() -> None:
    for processes in (PROCESSES, SIMULATED):
        assert processes["redis"].startswith("redis-server deploy/redis.conf")
        assert all(
            cmd.startswith(RESPAWN) or ("DRAFTGEN_GPU=" in cmd and RESPAWN in cmd)
            for name, cmd in processes.items()
            if name != "redis"
        )


def numbers(pattern: str, prefix: str) -> set[int]:
    """The number `pattern` captures in each simulated-node line whose name starts with `prefix`."""
    found = [re.search(pattern, cmd) for name, cmd in SIMULATED.items() if name.startswith(prefix)]
    assert all(found)
    return {int(match.group(1)) for match in found if match}


def test_the_simulated_node_has_a_server_with_metrics_for_each_generate_worker() -> None:
    ports, gpus = numbers(r"--port (\d+)", "sim"), numbers(r"DRAFTGEN_GPU=(\d+)", "gen")
    assert ports == {30000 + gpu for gpu in gpus} and len(gpus) == 2
    sims = [cmd for name, cmd in SIMULATED.items() if name.startswith("sim")]
    assert all("--enable-metrics" in cmd for cmd in sims)  # without /metrics, liveness cannot judge a server
    # Chunked as `node serve` starts SGLang, so that the workers see the streams a real node sends.
    assert all(f"--stream-interval {DEFAULT_STREAM_INTERVAL_TOKENS}" in cmd for cmd in sims)


def test_the_node_runs_redis_one_uploader_and_flower() -> None:
    assert "deploy/redis.conf" in PROCESSES["redis"]
    assert "-Q upload -c 1" in PROCESSES["upload"]
    assert "celery -A workers flower" in PROCESSES["flower"]


def test_each_server_line_builds_a_valid_sglang_command() -> None:
    command = shlex.split(PROCESSES["sglang3"].removeprefix(RESPAWN))
    assert command[:3] == ["python", "-m", "node"]
    result = subprocess.run(
        [sys.executable, *command[1:], "--dry-run"],
        env={**os.environ, "DRAFTGEN_MODEL_PATH": "/dev/shm/Qwen3.6-27B"},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "CUDA_VISIBLE_DEVICES=3" in result.stdout and "--port 30003" in result.stdout


def test_a_server_line_without_a_model_says_so_in_one_line() -> None:
    command = shlex.split(PROCESSES["sglang0"].removeprefix(RESPAWN))
    environment = {name: value for name, value in os.environ.items() if name != "DRAFTGEN_MODEL_PATH"}
    result = subprocess.run(
        [sys.executable, *command[1:], "--dry-run"],
        env=environment,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2  # a usage error: scripts/respawn does not start it again
    assert result.stderr.strip().splitlines() == [
        "error: --model-path is required (a folder with config.json and the shards), or DRAFTGEN_MODEL_PATH"
    ]
