"""`scripts/respawn` starts a command again whenever it ends without being asked to (killed, crashed, or
exiting 75), at once when it asked, after a growing delay when it keeps dying; a clean exit, a usage
error and a signal to the wrapper end it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from devstack.local_stack import PROJECT_ROOT

RESPAWN = str(PROJECT_ROOT / "scripts" / "respawn")
TIMEOUT_S = 30


def exits_with_75_until_the_third_start(counter: Path) -> list[str]:
    script = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); n = int(p.read_text() or 0) + 1 "
        "if p.exists() else 1; p.write_text(str(n)); sys.exit(75 if n < 3 else 0)"
    )
    return [sys.executable, "-c", script, str(counter)]


def test_a_command_that_asks_to_be_restarted_is_started_again_until_it_ends_for_good(tmp_path: Path) -> None:
    counter = tmp_path / "starts"
    result = subprocess.run(
        [RESPAWN, *exits_with_75_until_the_third_start(counter)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0
    assert counter.read_text() == "3"
    assert result.stderr.count("starting it again") == 2


def ends_with_until_the_last_start(counter: Path, codes: list[int]) -> list[str]:
    """A command whose n-th start ends with codes[n-1] (a negative code: killed by that signal)."""
    script = (
        "import os, pathlib, sys; p = pathlib.Path(sys.argv[1]); n = int(p.read_text()) + 1 if p.exists() "
        "else 1; p.write_text(str(n)); code = int(sys.argv[1 + n]); "
        "os.kill(os.getpid(), -code) if code < 0 else sys.exit(code)"
    )
    return [sys.executable, "-c", script, str(counter), *map(str, codes)]


def test_a_killed_or_crashed_command_is_started_again_after_a_delay_that_grows(tmp_path: Path) -> None:
    counter = tmp_path / "starts"
    result = subprocess.run(
        [RESPAWN, *ends_with_until_the_last_start(counter, [-signal.SIGKILL, 1, 0])],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0
    assert counter.read_text() == "3"
    assert "was killed by signal 9; starting it again in 1 s" in result.stderr
    assert "exited with 1; starting it again in 2 s" in result.stderr


def test_a_clean_exit_or_a_usage_error_ends_the_wrapper_with_its_code() -> None:
    for code in (0, 2):
        command = [RESPAWN, sys.executable, "-c", f"raise SystemExit({code})"]
        result = subprocess.run(command, timeout=TIMEOUT_S)
        assert result.returncode == code


def test_sigterm_reaches_the_command_and_ends_the_loop_even_when_the_command_answers_75() -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen(
        [RESPAWN, sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 75
    assert "starting it again" not in stderr
