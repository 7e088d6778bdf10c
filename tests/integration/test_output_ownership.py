"""An output belongs to one run: a second run is refused there before anything of it is pinned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from core.exit_codes import EXIT_USAGE
from workers.state.keys import RunKeys

pytestmark = pytest.mark.integration


def enqueue(redis_url: str, data: Path, run: str, output: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "producer", "enqueue", str(data), "--run", run, "--output", str(output)],
        env={**os.environ, "DRAFTGEN_REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_second_run_given_another_runs_output_is_refused_and_nothing_of_it_is_pinned(
    redis_url: str, tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"question {i}"}) + "\n" for i in range(4)))
    output = tmp_path / "out"
    assert enqueue(redis_url, data, "run-a", output).returncode == 0
    second = enqueue(redis_url, data, "run-b", output)
    assert second.returncode == EXIT_USAGE
    assert "holds the output of run 'run-a'" in second.stderr
    assert redis.Redis.from_url(redis_url).exists(RunKeys("run-b").settings) == 0
    assert json.loads((output / "run.json").read_text())["run"] == "run-a"
