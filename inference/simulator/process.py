"""`SimulatorProcess`: the simulator as a real subprocess on a free port, for tests and benchmarks.

with SimulatorProcess(SimulatorSettings(speedup=200)) as sim:
    client = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0, timeout=10)
    sim.admin.set_faults(error_rate=1.0)
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from inference.simulator.admin import AdminClient
from inference.simulator.settings import SimulatorSettings, settings_to_argv

DEFAULT_STARTUP_TIMEOUT_S = 30.0
DEFAULT_STOP_TIMEOUT_S = 10.0
HEALTH_POLL_INTERVAL_S = 0.02
HEALTH_PROBE_TIMEOUT_S = 2.0
LOCALHOST = "127.0.0.1"
SIMULATOR_MODULE = "inference.simulator"
REPOSITORY_ROOT = Path(__file__).resolve().parents[2]  # so the child imports this checkout from any cwd


def free_port(host: str = LOCALHOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def pinned_to_cpu(argv: list[str], cpu: int | None) -> list[str]:
    """The command run on that core alone (every thread of it), with `taskset` where there is one."""
    if cpu is None or not shutil.which("taskset"):
        return argv
    return ["taskset", "-c", str(cpu), *argv]


class SimulatorProcess:
    """Starts `python -m inference.simulator` with `settings` (port replaced by a free one unless
    `keep_port`), waits for `/health` 200 (deadline `startup_timeout_s`), and stops it on exit.

    `cpu`: pin the server to that CPU with `taskset` when available. The server's stderr (the
    SGLang-style log) goes to a temporary file: `log_text()`.
    """

    def __init__(
        self,
        settings: SimulatorSettings | None = None,
        *,
        keep_port: bool = False,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        cpu: int | None = None,
    ) -> None:
        settings = settings or SimulatorSettings()
        if not keep_port:
            settings = dataclasses.replace(settings, port=free_port(settings.host))
        self.settings = settings
        self.startup_timeout_s = startup_timeout_s
        self.cpu = cpu
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self.admin = AdminClient(
            self.url, timeout_s=max(HEALTH_PROBE_TIMEOUT_S, DEFAULT_STOP_TIMEOUT_S), api_key=settings.api_key
        )

    @property
    def port(self) -> int:
        return self.settings.port

    @property
    def url(self) -> str:
        host = LOCALHOST if self.settings.host in ("0.0.0.0", "") else self.settings.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def pid(self) -> int:
        return self._running().pid

    def command(self) -> list[str]:
        command = [sys.executable, "-m", SIMULATOR_MODULE, *settings_to_argv(self.settings)]
        return pinned_to_cpu(command, self.cpu)

    def start(self, wait: bool = True) -> SimulatorProcess:
        """Launch the process; with `wait`, return once `/health` answers 200."""
        if self._process is not None:
            raise RuntimeError("the simulator is already started")
        self._log_file = tempfile.NamedTemporaryFile(prefix="simulator-", suffix=".log", delete=False)  # noqa: SIM115
        path = os.pathsep.join(filter(None, [str(REPOSITORY_ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        self._process = subprocess.Popen(
            self.command(), stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        if wait:
            self.wait_until_healthy()
        return self

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError("the simulator is not started")
        return self._process

    def wait_until_healthy(self, timeout_s: float | None = None) -> None:
        """Poll `/health` until 200; raise if the process exits or the deadline passes."""
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        probe = AdminClient(self.url, timeout_s=HEALTH_PROBE_TIMEOUT_S)
        while time.monotonic() < deadline:
            if self._running().poll() is not None:
                raise RuntimeError(
                    f"the simulator exited with {self._running().returncode}:\n{self.log_text()}"
                )
            if probe.health_status() == 200:
                return
            time.sleep(HEALTH_POLL_INTERVAL_S)
        raise TimeoutError(f"the simulator was not healthy within the deadline:\n{self.log_text()}")

    def returncode(self) -> int | None:
        return self._running().poll()

    def wait_for_exit(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> int:
        return self._running().wait(timeout=timeout_s)

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL if it has not exited by the deadline; returns the exit code."""
        process = self._running()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait()

    def kill(self) -> int:
        """SIGKILL, like a crashed server."""
        process = self._running()
        if process.poll() is None:
            process.kill()
        return process.wait()

    def log_text(self) -> str:
        if self._log_file is None:
            return ""
        return Path(self._log_file.name).read_text(errors="replace")

    def close(self) -> None:
        if self._process is not None:
            self.stop()
        if self._log_file is not None:
            self._log_file.close()
            Path(self._log_file.name).unlink(missing_ok=True)
            self._log_file = None

    def __enter__(self) -> SimulatorProcess:
        if self._process is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
