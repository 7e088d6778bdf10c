"""The local node recipe (Procfile.simulated under `honcho start`) runs a user's own run to the end, and a
generate worker killed mid-run is replaced while the rest of the node, Redis included, goes on.

The Procfile is run as shipped, but for its fixed ports (Redis, the two servers, Flower), moved to free
ones so that the test never meets another Redis on this machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.exit_codes import EXIT_OK
from devstack.local_stack import PROJECT_ROOT, free_port, wait_until

pytestmark = pytest.mark.integration

PROCFILE = PROJECT_ROOT / "Procfile.simulated"
SHIPPED_PORTS = {"redis": 6379, "sim0": 30000, "sim1": 30001, "flower": 5555}
PROMPTS = 300
RUN = "recipe"
UP_S = 60.0
WAIT_S = 240.0


def consecutive_free_ports() -> int:
    """A port whose next one is free too (the servers listen on BASE_PORT + GPU)."""
    for _ in range(50):
        port = free_port()
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def procfile_on_free_ports(tmp_path: Path, redis_port: int, base_port: int, flower_port: int) -> Path:
    text = PROCFILE.read_text()
    text = text.replace(
        "redis-server deploy/redis.conf",
        f"redis-server deploy/redis.conf --port {redis_port} --dir {tmp_path}",
    )
    text = text.replace("--port 30000", f"--port {base_port}").replace(
        "--port 30001", f"--port {base_port + 1}"
    )
    text = text.replace("--port=5555", f"--port={flower_port}")
    moved = tmp_path / "Procfile"
    moved.write_text(text)
    return moved


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, str], Path]]:
    redis_port, base_port, flower_port = free_port(), consecutive_free_ports(), free_port()
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith("DRAFTGEN_")},
        "DRAFTGEN_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "DRAFTGEN_BASE_PORT": str(base_port),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    log = tmp_path / "honcho.log"
    with log.open("w") as out:
        honcho = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "honcho",
                "start",
                "-f",
                str(procfile_on_free_ports(tmp_path, redis_port, base_port, flower_port)),
                "-d",
                str(PROJECT_ROOT),
            ],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    try:
        yield honcho, env, log
    finally:
        if honcho.poll() is None:
            os.killpg(honcho.pid, signal.SIGINT)
            try:
                honcho.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(honcho.pid, signal.SIGKILL)
                honcho.wait()


def producer(env: dict[str, str], *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "producer", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def generated(env: dict[str, str]) -> int:
    progress = json.loads(producer(env, "status", "--run", RUN, "--json").stdout)["progress"]
    return int(progress["committed"]) + int(progress["staged"])


def celery_pids(worker: str) -> list[int]:
    """The Celery processes (not their respawn wrappers) of the worker named `worker`@host."""
    found = subprocess.run(
        ["pgrep", "-f", f"worker .*-n {worker}@"], capture_output=True, text=True, check=False
    )
    pids = [int(pid) for pid in found.stdout.split()]
    return [
        pid
        for pid in pids
        if "respawn" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    ]


def test_the_simulated_node_runs_a_users_run_and_replaces_a_killed_worker_without_stopping(
    node: tuple[subprocess.Popen[str], dict[str, str], Path], tmp_path: Path
) -> None:
    honcho, env, log = node
    wait_until(
        lambda: len(celery_pids("gen0")) == 1 and len(celery_pids("gen1")) == 1,
        timeout_s=UP_S,
        what="both generate workers",
    )
    data = tmp_path / "mine.jsonl"
    data.write_text(
        "".join(json.dumps({"uid": i, "question": f"question {i}"}) + "\n" for i in range(PROMPTS))
    )
    enqueued = producer(
        env,
        "enqueue",
        str(data),
        "--run",
        RUN,
        "--prompt-field",
        "question",
        "--id-field",
        "uid",
        "--output",
        str(tmp_path / "out"),
    )
    assert enqueued.returncode == EXIT_OK, enqueued.stderr

    # When a generate worker is killed mid-run
    wait_until(
        lambda: "completions" in producer(env, "status", "--run", RUN).stdout,
        timeout_s=UP_S,
        what="completions",
    )
    [killed] = celery_pids("gen0")
    os.kill(killed, signal.SIGKILL)

    # Then it is replaced, the node goes on, and the run finishes with every prompt once
    wait_until(lambda: celery_pids("gen0") not in ([], [killed]), timeout_s=UP_S, what="gen0 replaced")
    waited = producer(env, "wait", "--run", RUN, "--timeout", str(WAIT_S), timeout_s=WAIT_S + 30)
    assert waited.returncode == EXIT_OK, waited.stdout + waited.stderr
    assert producer(env, "verify", "--run", RUN).returncode == EXIT_OK
    assert honcho.poll() is None, log.read_text()[-3000:]
    assert "respawn: 'celery' was killed by signal 9; starting it again in 1 s" in log.read_text()
