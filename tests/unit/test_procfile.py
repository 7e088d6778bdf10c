"""The Procfile describes one whole node: a server and a generate worker per GPU, the uploader, Flower."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from honcho.environ import parse_procfile

from devstack.local_stack import PROJECT_ROOT

PROCESSES = parse_procfile((PROJECT_ROOT / "Procfile").read_text()).processes


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


def test_a_generate_worker_that_exits_to_be_restarted_is_restarted_without_taking_the_node_down() -> None:
    generate_lines = [cmd for name, cmd in PROCESSES.items() if name.startswith("gen")]
    assert all("scripts/respawn celery -A workers worker" in cmd for cmd in generate_lines)


def test_the_node_runs_redis_one_uploader_and_flower() -> None:
    assert "deploy/redis.conf" in PROCESSES["redis"]
    assert "-Q upload -c 1" in PROCESSES["upload"]
    assert "celery -A workers flower" in PROCESSES["flower"]


def test_each_server_line_builds_a_valid_sglang_command() -> None:
    command = shlex.split(PROCESSES["sglang3"].replace("$DRAFTGEN_MODEL_PATH", "/dev/shm/Qwen3.6-27B"))
    assert command[:3] == ["python", "-m", "node"]
    result = subprocess.run(
        [sys.executable, *command[1:], "--dry-run"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "CUDA_VISIBLE_DEVICES=3" in result.stdout and "--port 30003" in result.stdout
