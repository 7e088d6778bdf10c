"""Processes of a local rehearsal: redis-server, simulated GPUs, workers, uploader, Flower.

Used by `python -m devstack demo` and by the integration tests, so both run the real commands.
Every process writes its log to a file and is started in its own process group, so a SIGKILL
takes it down with its children, as a crash would.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from core.private_files import PRIVATE_FILE_MODE, write_private
from inference.simulator.process import free_port as free_port  # one free-port finder for all
from inference.simulator.process import pinned_to_cpu

PROJECT_ROOT = Path(__file__).resolve().parent.parent
REDIS_CONF = PROJECT_ROOT / "deploy" / "redis.conf"
DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_STOP_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.05
HTTP_PROBE_TIMEOUT_S = 2.0
LOG_TAIL_LINES = 40
LOCAL_REDIS_HOST = "127.0.0.1"
# Beside the Redis data, readable by its owner only: `requirepass <password>`, made at the first start and
# included by every later one (a restart on the same data, AOF and all, keeps its password).
REDIS_AUTH_CONF = "redis-auth.conf"
REDIS_PASSWORD_BYTES = 32  # 256 random bits, as 64 hex digits: nothing in them needs quoting in a URL
REQUIREPASS_DIRECTIVE = "requirepass"


class ProcessFailed(RuntimeError):
    """A managed process exited or never became ready; the message carries its log's tail."""


def wait_until(condition: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    """Poll `condition` until it holds; TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_PROBE_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@dataclass
class ManagedProcess:
    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path = PROJECT_ROOT
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("ab")
        self.process = subprocess.Popen(
            list(self.argv),
            cwd=self.cwd,
            env={**os.environ, **self.env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log_file.close()
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, ready: Callable[[], bool], *, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        def ready_or_dead() -> bool:
            if not self.alive():
                raise ProcessFailed(f"{self.name} exited during start-up; its log ends:\n{self.log_tail()}")
            return ready()

        try:
            wait_until(ready_or_dead, timeout_s=timeout_s, what=f"{self.name} to be ready")
        except TimeoutError as error:
            raise ProcessFailed(f"{error}; its log ends:\n{self.log_tail()}") from error

    def wait_for_log(self, text: str, *, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        self.wait_ready(lambda: text in self.log_text(), timeout_s=timeout_s)

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, not a shutdown."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            assert self.process is not None
            self.process.wait()

    def stop(self, *, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL if it has not exited in time."""
        if not self.alive():
            return
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


def _password_in(auth_conf: Path) -> str | None:
    for line in auth_conf.read_text().splitlines():
        directive, _, value = line.strip().partition(" ")
        if directive == REQUIREPASS_DIRECTIVE and value.strip():
            return value.strip()
    return None


def redis_password(data_dir: Path) -> tuple[str, Path]:
    """The local Redis's password and the config file that sets it: made at the first start, kept."""
    auth_conf = data_dir / REDIS_AUTH_CONF
    if auth_conf.exists():
        auth_conf.chmod(PRIVATE_FILE_MODE)
        kept = _password_in(auth_conf)
        if kept is not None:
            return kept, auth_conf
    password = secrets.token_hex(REDIS_PASSWORD_BYTES)
    write_private(auth_conf, f"{REQUIREPASS_DIRECTIVE} {password}\n")
    return password, auth_conf


def local_redis_url(port: int, password: str) -> str:
    return f"redis://:{password}@{LOCAL_REDIS_HOST}:{port}/0"


@dataclass
class RedisProcess(ManagedProcess):
    """A local redis-server with a password; `url` carries it (keep it off the screen: `redacted_url`)."""

    port: int = 0
    password: str = field(default="", repr=False)

    @property
    def url(self) -> str:
        return local_redis_url(self.port, self.password)


def redis_process(port: int, data_dir: Path, log_dir: Path) -> RedisProcess:
    """redis-server with the shipped config, its data in `data_dir`, and the password of that data:
    included from a file only its owner reads, so it is on no command line (`ps` shows argv to all)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    password, auth_conf = redis_password(data_dir)
    argv = [
        "redis-server",
        str(REDIS_CONF),
        "--include",
        str(auth_conf.resolve()),
        "--port",
        str(port),
        "--dir",
        str(data_dir),
    ]
    return RedisProcess(f"redis:{port}", argv, log_dir / f"redis-{port}.log", port=port, password=password)


def start_redis(port: int, data_dir: Path, log_dir: Path) -> RedisProcess:
    """Start redis-server on 127.0.0.1:`port` and wait until it serves; its `url` has the password."""
    process = redis_process(port, data_dir, log_dir)
    process.start()
    process.wait_for_log("Ready to accept connections")
    return process


def worker_env(redis_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {"DRAFTGEN_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1", **(extra or {})}


def celery_command(*args: str) -> list[str]:
    """`celery -A workers ARGS...` with this interpreter."""
    return [sys.executable, "-m", "celery", "-A", "workers", *args]


def celery_worker(
    name: str,
    queue: str,
    env: Mapping[str, str],
    log_dir: Path,
    *,
    concurrency: int | None = None,
    mingle_and_gossip: bool = False,  # on, as the systemd units run workers; off saves a start-up second
    cpu: int | None = None,  # pin the worker (every thread of it) to this core, with taskset
) -> ManagedProcess:
    argv = celery_command("worker", "-Q", queue, "-n", f"{name}@%h", "-l", "INFO")
    if not mingle_and_gossip:
        argv += ["--without-mingle", "--without-gossip"]
    if concurrency is not None:
        argv += ["-c", str(concurrency)]
    return ManagedProcess(name, pinned_to_cpu(argv, cpu), log_dir / f"{name}.log", env=env)


def start_celery_worker(
    name: str,
    queue: str,
    env: Mapping[str, str],
    log_dir: Path,
    *,
    concurrency: int | None = None,
    mingle_and_gossip: bool = False,
    cpu: int | None = None,
) -> ManagedProcess:
    worker = celery_worker(
        name, queue, env, log_dir, concurrency=concurrency, mingle_and_gossip=mingle_and_gossip, cpu=cpu
    )
    process = worker.start()
    process.wait_for_log(" ready.")
    return process


def flower_process(port: int, env: Mapping[str, str], log_dir: Path) -> ManagedProcess:
    argv = celery_command("flower", f"--port={port}", "--address=127.0.0.1")
    return ManagedProcess("flower", argv, log_dir / "flower.log", env=env)
