"""`scripts/respawn` starts a command again when it exits with 75, and passes every other end on."""

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


def test_any_other_exit_code_ends_the_wrapper_with_it() -> None:
    result = subprocess.run([RESPAWN, sys.executable, "-c", "raise SystemExit(3)"], timeout=TIMEOUT_S)
    assert result.returncode == 3


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
