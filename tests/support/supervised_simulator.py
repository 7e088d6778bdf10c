"""A simulated GPU's server kept up as systemd's `Restart=always` keeps SGLang up: whenever its process
dies (a crash fault, a flaky server, the liveness watch's restart command) it is started again on the
same port, with the settings `settings_for_life` gives for that life. Its current pid is in `pid_file`,
for a restart command to kill, and `restarts` counts the restarts."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from inference.simulator import SimulatorProcess, SimulatorSettings
from inference.simulator.admin import AdminClient
from inference.simulator.process import free_port

STOP_TIMEOUT_S = 10.0
POLL_S = 0.1
KILL_SCRIPT = (
    "import os, pathlib, signal, sys; os.kill(int(pathlib.Path(sys.argv[1]).read_text()), signal.SIGKILL)"
)


class SupervisedSimulator:
    def __init__(self, settings_for_life: Callable[[int], SimulatorSettings], pid_file: Path) -> None:
        self._settings_for_life = settings_for_life
        self._port = free_port()
        self.pid_file = pid_file
        self.restarts = 0
        self.lives: list[SimulatorProcess] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._supervise, name="simulator-supervisor", daemon=True)

    @property
    def url(self) -> str:
        return self.lives[0].url

    @property
    def admin(self) -> AdminClient:
        with self._lock:
            return self.lives[-1].admin

    def restart_command(self) -> str:
        """What the liveness watch runs to restart this server: a SIGKILL, and this supervisor starts it."""
        return shlex.join([sys.executable, "-c", KILL_SCRIPT, str(self.pid_file)])

    def start(self) -> SupervisedSimulator:
        self._start_life()
        self._thread.start()
        return self

    def _start_life(self) -> None:
        settings = dataclasses.replace(self._settings_for_life(len(self.lives)), port=self._port)
        process = SimulatorProcess(settings, keep_port=True).start()
        with self._lock:
            self.lives.append(process)
        self.pid_file.write_text(str(process.pid))

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            current = self.lives[-1]
            try:
                current.wait_for_exit(timeout_s=POLL_S)
            except subprocess.TimeoutExpired:  # still running
                continue
            if self._stopping.is_set():
                return
            self.restarts += 1
            self._start_life()

    def log_text(self) -> str:
        return "\n".join(f"--- life {i}\n{life.log_text()}" for i, life in enumerate(self.lives))

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(STOP_TIMEOUT_S)
        for life in self.lives:
            life.close()
