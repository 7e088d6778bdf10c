"""The server processes: one per GPU with its own log, stopped on a signal, and a loud exit when one dies.

A fake `sglang` executable stands in for SGLang: it logs its argv and GPU and runs until signalled.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from node.command import build_commands
from node.errors import LaunchError, ServerExited
from node.launcher import StopRequest, notify_systemd, run_fleet
from node.settings import ServeSettings

FAST_POLL_S = 0.05
SHORT_GRACE_S = 5.0
JOIN_TIMEOUT_S = 15.0
REPO_ROOT = Path(__file__).resolve().parents[2]


def settings_for(executable: Path, log_dir: Path, gpus: tuple[int, ...] = (0, 1)) -> ServeSettings:
    return ServeSettings(
        model_path="/dev/shm/Tiny",
        served_model_name="tiny",
        gpus=gpus,
        base_port=39000,
        log_dir=log_dir,
        sglang_executable=str(executable),
    )


def log_of(log_dir: Path, gpu: int) -> str:
    path = log_dir / f"sglang-gpu{gpu}.log"
    return path.read_text() if path.exists() else ""


def test_each_gpu_runs_its_own_server_logging_to_its_own_file_until_asked_to_stop(
    fake_sglang: Path, tmp_path: Path, wait_for: Callable[..., None]
) -> None:
    # Given two GPUs
    logs = tmp_path / "logs"
    commands = build_commands(settings_for(fake_sglang, logs))
    stop = StopRequest()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            run_fleet(
                commands, stop=stop, wait_ready=False, poll_interval_s=FAST_POLL_S, stop_grace_s=SHORT_GRACE_S
            )
        except BaseException as error:
            errors.append(error)

    runner = threading.Thread(target=serve)
    runner.start()

    # When both servers are running
    wait_for(
        lambda: all("fake sglang running" in log_of(logs, gpu) for gpu in (0, 1)), "both servers to start"
    )

    # Then each saw only its own GPU and its own port
    for gpu in (0, 1):
        log = log_of(logs, gpu)
        assert f"CUDA_VISIBLE_DEVICES={gpu}" in log
        assert f"--port {39000 + gpu} " in log
        assert log.startswith("=== draftgen serve ")

    # And when a stop is requested, every server receives it and the fleet returns cleanly
    stop.request(signal.SIGINT)
    runner.join(JOIN_TIMEOUT_S)
    assert not runner.is_alive()
    assert errors == []
    assert all("received SIGINT" in log_of(logs, gpu) for gpu in (0, 1))


def test_a_server_that_dies_stops_the_others_and_raises_with_its_log(
    fake_sglang: Path, tmp_path: Path
) -> None:
    # Given GPU 1 runs out of memory while loading
    logs = tmp_path / "logs"
    commands = build_commands(settings_for(fake_sglang, logs))
    environment = {  # (once GPU 0 runs: a SIGTERM before its handler would leave no line to show it)
        **os.environ,
        "FAKE_SGLANG_CRASH_GPUS": "1",
        "FAKE_SGLANG_CRASH_AFTER": "0",
        "FAKE_SGLANG_MARKERS": str(tmp_path),
    }

    # When the fleet runs
    with pytest.raises(ServerExited) as caught:
        run_fleet(
            commands,
            stop=StopRequest(),
            wait_ready=False,
            poll_interval_s=FAST_POLL_S,
            stop_grace_s=SHORT_GRACE_S,
            base_env=environment,
        )

    # Then the error names the GPU, its exit code and the end of its log, and GPU 0 was stopped
    assert caught.value.gpu == 1
    assert caught.value.returncode == 7
    assert "CUDA out of memory" in str(caught.value)
    assert "received SIGTERM" in log_of(logs, 0)


def test_a_server_that_dies_while_loading_ends_the_readiness_wait_at_once(
    fake_sglang: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    commands = build_commands(settings_for(fake_sglang, logs, gpus=(0,)))

    with pytest.raises(ServerExited, match="CUDA out of memory"):
        run_fleet(
            commands,
            stop=StopRequest(),
            wait_ready=True,
            ready_timeout_s=JOIN_TIMEOUT_S,
            probe_interval_s=FAST_POLL_S,
            stop_grace_s=SHORT_GRACE_S,
            base_env={**os.environ, "FAKE_SGLANG_CRASH_GPUS": "0"},
        )


def test_a_missing_sglang_executable_says_how_to_install_it(tmp_path: Path) -> None:
    commands = build_commands(settings_for(tmp_path / "no-such-sglang", tmp_path / "logs"))
    with pytest.raises(LaunchError, match=r"pip install '\.\[gpu\]'"):
        run_fleet(commands, stop=StopRequest(), wait_ready=False, stop_grace_s=SHORT_GRACE_S)


def test_sigterm_to_serve_is_forwarded_to_every_server_and_serve_exits_zero(
    fake_sglang: Path, tmp_path: Path, wait_for: Callable[..., None]
) -> None:
    # Given `serve` running two fake servers as a real process
    logs = tmp_path / "logs"
    serve = subprocess.Popen(
        [sys.executable, "-m", "node", "serve", "--model-path", "/dev/shm/Tiny", "--gpus", "0,1",
         "--base-port", "39100", "--log-dir", str(logs), "--sglang-executable", str(fake_sglang),
         "--no-wait"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(
            lambda: all("fake sglang running" in log_of(logs, gpu) for gpu in (0, 1)), "both servers to start"
        )

        # When systemd (or a user) sends SIGTERM to serve
        serve.send_signal(signal.SIGTERM)
        output, _ = serve.communicate(timeout=JOIN_TIMEOUT_S)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.communicate()

    # Then each server got SIGTERM once, and serve exited cleanly
    assert serve.returncode == 0, output.decode()
    for gpu in (0, 1):
        assert log_of(logs, gpu).count("received SIGTERM") == 1


def test_systemd_is_told_when_every_server_generates(tmp_path: Path) -> None:
    # Given systemd's notification socket, as a Type=notify unit sees it
    address = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(str(address))

        # When serve reports readiness
        assert notify_systemd("READY=1", {"NOTIFY_SOCKET": str(address)})

        # Then systemd receives it; and outside systemd nothing is sent
        assert systemd.recv(64) == b"READY=1"
    assert not notify_systemd("READY=1", {})


def test_the_api_key_reaches_the_server_in_a_file_only_its_owner_reads(
    fake_sglang: Path, tmp_path: Path, wait_for: Callable[..., None]
) -> None:
    # Given a key and a permissive umask
    logs = tmp_path / "logs"
    settings = dataclasses.replace(settings_for(fake_sglang, logs, gpus=(0,)), api_key="sk-secret")
    commands = build_commands(settings)
    stop = StopRequest()
    previous = os.umask(0o022)
    try:
        runner = threading.Thread(
            target=run_fleet,
            args=(commands,),
            kwargs={
                "stop": stop,
                "wait_ready": False,
                "poll_interval_s": FAST_POLL_S,
                "stop_grace_s": SHORT_GRACE_S,
            },
        )
        runner.start()
        wait_for(lambda: "fake sglang running" in log_of(logs, 0), "the server to start")
    finally:
        os.umask(previous)
        stop.request(signal.SIGTERM)
        runner.join(JOIN_TIMEOUT_S)
    # Then its command line (what `ps` shows) names a file, and the file is the owner's alone
    secrets = commands[0].secrets_file
    assert secrets is not None and "sk-secret" not in log_of(logs, 0)
    assert f"--config {secrets.path}" in log_of(logs, 0)
    assert secrets.path.stat().st_mode & 0o777 == 0o600
    assert secrets.path.read_text() == 'api_key: "sk-secret"\n'
