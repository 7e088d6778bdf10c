"""Run one SGLang server per GPU as child processes, each logging to its own file.

Each child gets its own session, so a Ctrl-C in the terminal reaches it once (forwarded by us)
rather than twice. A stop signal is forwarded to every child; whatever is still alive after the
grace period is SIGKILLed with its whole process group, so no scheduler process keeps a GPU's
memory. A child that exits on its own ends the fleet: the others are stopped and ServerExited is
raised with the tail of its log.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO

from core.private_files import write_private
from inference.readiness import (
    DEFAULT_PROBE_INTERVAL_S,
    DEFAULT_READY_TIMEOUT_S,
    Probe,
    ReadinessTarget,
    log_tail,
    wait_all_ready,
)
from node.command import ServerCommand
from node.errors import LaunchError, ServerExited

logger = logging.getLogger(__name__)

STOP_GRACE_S = 60.0
"""SGLang tears down its scheduler processes on SIGTERM; systemd's TimeoutStopSec is set above this."""
PROCESS_POLL_INTERVAL_S = 0.5
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class StopRequest:
    """Set from a signal handler (or a test): which signal to forward to the servers."""

    event: threading.Event = field(default_factory=threading.Event)
    signum: int = signal.SIGTERM

    def request(self, signum: int = signal.SIGTERM) -> None:
        self.signum = signum
        self.event.set()


class _Stopping(Exception):
    """Control flow, not an error: a stop was requested while waiting for readiness."""


@dataclass
class _Server:
    command: ServerCommand
    process: subprocess.Popen[bytes]
    log: IO[bytes]


class Fleet:
    """The running servers, one per command."""

    def __init__(self, commands: Sequence[ServerCommand], base_env: Mapping[str, str] | None = None) -> None:
        self.commands = list(commands)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.servers: list[_Server] = []

    def start(self) -> None:
        for command in self.commands:
            try:
                self.servers.append(self._start_one(command))
            except OSError as error:
                self.stop(signal.SIGTERM, STOP_GRACE_S)
                raise LaunchError(
                    f"cannot start the server for GPU {command.gpu} ({command.argv[0]}): {error.strerror}; "
                    "is sglang installed in this environment (pip install '.[gpu]')?"
                ) from error

    def _start_one(self, command: ServerCommand) -> _Server:
        command.log_path.parent.mkdir(parents=True, exist_ok=True)
        if command.secrets_file is not None:
            write_private(command.secrets_file.path, command.secrets_file.content())
        log = command.log_path.open("ab")
        started = datetime.now(UTC).isoformat(timespec="seconds")
        log.write(f"=== draftgen serve {started}: {command.render()}\n".encode())
        log.flush()
        try:
            process = subprocess.Popen(
                command.argv,
                env={**self.base_env, **command.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError:
            log.close()
            raise
        logger.info(
            "GPU %d: started pid %d, serving %s, log %s",
            command.gpu,
            process.pid,
            command.url,
            command.log_path,
        )
        return _Server(command, process, log)

    def check_alive(self) -> None:
        """Raise ServerExited for the first server that is no longer running."""
        for server in self.servers:
            returncode = server.process.poll()
            if returncode is not None:
                raise ServerExited(server.command.gpu, returncode, self.tail(server))

    def tail(self, server: _Server) -> str:
        return log_tail(server.command.log_path, secrets=server.command.secrets())

    def stop(self, signum: int, grace_s: float) -> None:
        """Forward `signum` to every live server; SIGKILL the process groups left after `grace_s`."""
        for server in self.servers:
            if server.process.poll() is None:
                logger.info(
                    "GPU %d: sending %s to pid %d",
                    server.command.gpu,
                    signal.Signals(signum).name,
                    server.process.pid,
                )
                _send(server.process.pid, signum, group=False)
        deadline = time.monotonic() + grace_s
        for server in self.servers:
            try:
                server.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("GPU %d: still running after %.0f s, killing it", server.command.gpu, grace_s)
            # The group outlives its leader when a scheduler process hangs on: kill it regardless.
            _send(server.process.pid, signal.SIGKILL, group=True)
            server.process.wait()
            server.log.close()


def _send(pid: int, signum: int, *, group: bool) -> None:
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def run_fleet(
    commands: Sequence[ServerCommand],
    *,
    stop: StopRequest,
    wait_ready: bool = True,
    model: str = "default",
    api_key: str | None = None,
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
    poll_interval_s: float = PROCESS_POLL_INTERVAL_S,
    stop_grace_s: float = STOP_GRACE_S,
    observer: Callable[[Probe], None] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> None:
    """Start the servers, wait until each generates (unless told not to), and run until a stop request.

    Returns after a requested stop; raises ServerExited when a server dies, ServerNotReady when one
    never gets ready, LaunchError when one cannot start. The servers are always stopped on the way out.
    """
    fleet = Fleet(commands, base_env)
    fleet.start()
    try:
        if wait_ready:
            targets = [
                ReadinessTarget(url=c.url, model=model, api_key=api_key, log_path=c.log_path)
                for c in commands
            ]

            def check() -> None:
                if stop.event.is_set():
                    raise _Stopping
                fleet.check_alive()

            wait_all_ready(
                targets,
                timeout_s=ready_timeout_s,
                interval_s=probe_interval_s,
                observer=observer,
                check=check,
                sleep=stop.event.wait,
            )
            logger.info("all %d servers generate: %s", len(commands), ", ".join(c.url for c in commands))
        notify_systemd("READY=1")
        while not stop.event.wait(poll_interval_s):
            fleet.check_alive()
    except _Stopping:
        pass
    finally:
        notify_systemd("STOPPING=1")
        fleet.stop(stop.signum, stop_grace_s)


def notify_systemd(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Tell systemd (Type=notify) how we are doing; a no-op outside such a unit.

    With READY=1 sent only once every server generates, `systemctl start` and the units ordered
    after this one wait for real readiness rather than for the process to exist.
    """
    address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.sendto(state.encode(), address)
    return True


@contextmanager
def stop_on_signals(stop: StopRequest) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into a stop request while the block runs (main thread only)."""

    def handler(signum: int, _frame: object) -> None:
        logger.info("received %s, stopping the servers", signal.Signals(signum).name)
        stop.request(signum)

    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
