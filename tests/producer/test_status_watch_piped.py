"""`status --watch` into a pipe or a log writes one line per refresh (a live view would show nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from core.exit_codes import EXIT_OK
from producer.settings import REDIS_URL_ENV

pytestmark = pytest.mark.integration

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
REFRESH_S = "0.2"
LINES_AWAITED = 3
READ_TIMEOUT_S = 60


def watch_piped(redis_url: str, tmp_path: Path, *, run: str, prompts: int) -> subprocess.Popen[str]:
    """A run of `prompts` prompts enqueued, and `status --watch` of it started with its output a pipe."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"id": "q{i}", "prompt": "question {i}"}}\n' for i in range(prompts)))
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY_ROOT), REDIS_URL_ENV: redis_url}
    enqueue = ["enqueue", str(data), "--run", run, "--output", str(tmp_path / "o")]
    assert (
        subprocess.run([sys.executable, "-m", "producer", *enqueue], env=env, check=False).returncode
        == EXIT_OK
    )
    command = [sys.executable, "-m", "producer", "status", "--run", run]
    return subprocess.Popen(
        [*command, "--watch", REFRESH_S], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_status_watch_into_a_pipe_writes_a_line_per_refresh_until_interrupted(
    redis_url: str, tmp_path: Path
) -> None:
    watching = watch_piped(redis_url, tmp_path, run="w", prompts=3)
    try:
        assert watching.stdout is not None
        lines: list[str] = []
        enough = threading.Event()
        threading.Thread(target=collect, args=(watching.stdout, lines, enough), daemon=True).start()
        assert enough.wait(READ_TIMEOUT_S), f"{len(lines)} lines in {READ_TIMEOUT_S} s: {lines}"
        watching.send_signal(signal.SIGINT)
        _, errors = watching.communicate(timeout=READ_TIMEOUT_S)
    finally:
        watching.kill()
    for line in lines[:LINES_AWAITED]:
        assert " run w " in line and "0/3 committed" in line and line.endswith("\n"), lines
    assert watching.returncode == EXIT_OK, errors


def collect(stream: IO[str], lines: list[str], enough: threading.Event) -> None:
    for line in stream:
        lines.append(line)
        if len(lines) >= LINES_AWAITED:
            enough.set()


def test_status_watch_into_a_reader_that_stops_early_ends_quietly_as_a_pipe_to_head_does(
    redis_url: str, tmp_path: Path
) -> None:
    watching = watch_piped(redis_url, tmp_path, run="h", prompts=1)
    try:
        assert watching.stdout is not None
        assert " run h " in watching.stdout.readline()
        watching.stdout.close()  # as `head -1` does once it has its line
        _, errors = watching.communicate(timeout=READ_TIMEOUT_S)
    finally:
        watching.kill()
    assert watching.returncode == EXIT_OK, errors
    assert "Traceback" not in errors and "BrokenPipe" not in errors, errors
