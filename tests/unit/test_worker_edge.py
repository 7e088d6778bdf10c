"""`celery -A workers` with a bad DRAFTGEN_* variable stops with one line naming it, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from devstack.local_stack import PROJECT_ROOT

START_TIMEOUT_S = 60


def test_a_worker_given_a_bad_gpu_index_says_which_variable_and_shows_no_traceback() -> None:
    env = {**os.environ, "DRAFTGEN_GPU": "abc"}
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "workers", "worker", "--help"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode != 0
    assert "DRAFTGEN_GPU='abc'" in result.stderr
    assert "Traceback" not in result.stderr
