"""A generate worker whose consumer stopped taking messages while batches wait exits to be restarted.

The deaf consumer is made the way a broker reset leaves it: Celery's `cancel_consumer generate` (obeyed
here only because DRAFTGEN_REMOTE_CONTROL_COMMANDS says so) leaves the process up, beating, and taking
nothing. The limit is 10 s here,
not the README's 120 s: the limit itself is what the test checks, and the default would add two minutes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.local_stack import PROJECT_ROOT, celery_command, wait_until
from inference.simulator import SimulatorProcess
from tests.support import prompt_files
from tests.support.stack import Stack, simulators_running
from workers.recovery.consumer_watch import EXIT_NOT_CONSUMING

pytestmark = pytest.mark.integration

PROMPTS = 64
SPEEDUP = 50.0
LIMIT_S = 10
EXIT_S = 60.0
FINISH_S = 180.0


@pytest.fixture
def sims() -> Iterator[list[SimulatorProcess]]:
    with simulators_running(1, speedup=SPEEDUP) as running:
        yield running


def test_a_worker_that_stops_consuming_beside_waiting_batches_exits_75_and_status_says_why(
    redis_url: str, sims: list[SimulatorProcess], log_dir: Path, tmp_path: Path
) -> None:
    # Given a generate worker whose consumer of the generate queue was cancelled
    # (workers refuse cancel_consumer unless told to obey such commands: this test needs it obeyed)
    extra_env = {"DRAFTGEN_NOT_CONSUMING_LIMIT_S": str(LIMIT_S), "DRAFTGEN_REMOTE_CONTROL_COMMANDS": "true"}
    stack = Stack(redis_url, log_dir, sims, extra_env=extra_env)
    try:
        stack.start()
        deaf = stack.generators[0]
        cancel = subprocess.run(
            celery_command(
                "control", "cancel_consumer", "generate", "-d", f"{deaf.name}@{socket.gethostname()}"
            ),
            cwd=PROJECT_ROOT,
            env={**os.environ, **stack.env()},
            capture_output=True,
            text=True,
            check=False,
        )
        assert cancel.returncode == 0, cancel.stderr

        # When batches wait in its queue
        rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(PROMPTS, "w")]
        stack.enqueue(prompt_files.write_jsonl(tmp_path / "prompts.jsonl", rows), "deaf")

        # Then it exits with 75 within the limit and a few checks, and status tells the operator why
        wait_until(lambda: not deaf.alive(), timeout_s=EXIT_S, what="the deaf worker to exit")
        assert deaf.process is not None and deaf.process.returncode == EXIT_NOT_CONSUMING, deaf.log_tail()
        status = stack.producer("status", "--run", "deaf", "--json")
        warnings = json.loads(status.stdout)["warnings"]
        assert any("restarted itself" in w and "waited in the generate queue" in w for w in warnings), (
            warnings
        )

        # And started again, as scripts/respawn does, the worker finishes the run
        stack.start_generator(0)
        stack.wait_finished("deaf", timeout_s=FINISH_S)
        assert stack.verify("deaf").returncode == 0
    finally:
        stack.stop()
