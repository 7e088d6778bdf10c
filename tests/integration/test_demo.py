"""The README's first quick-start command, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from producer.local_stack import PROJECT_ROOT, free_port

pytestmark = pytest.mark.integration
DEMO_TIMEOUT_S = 300


def test_the_local_demo_runs_the_sample_end_to_end_and_verifies(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "producer",
            "demo",
            "--exit",
            "--workdir",
            str(tmp_path / "demo"),
            "--redis-port",
            str(free_port()),
            "--flower-port",
            str(free_port()),
            "--speedup",
            "100",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "new                 300 prompts" in result.stdout
    assert "OK: every prompt committed exactly once or dead-lettered" in result.stdout
    assert list((tmp_path / "demo" / "output").glob("demo-*/manifest/part-*.json"))  # one output per run
