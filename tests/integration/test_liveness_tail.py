"""Every run ends (docs/exactly-once.md, "Every run ends"), on real processes: a run whose last prompts drop
their connection, hang while the server answers others, and wedge the whole server, with nothing else
left to run, finishes by itself within the bound the docs state for its settings, those three
dead-lettered as poison and everything else committed once.

Real processes throughout: redis-server, two simulated GPUs kept up by a supervisor (the liveness watch's
restart is a SIGKILL and a new process on the same port), their generate workers and the uploader, with
the README's defaults but for three named below. The rule under test is the one users run; the liveness
watch's window and polls are shortened so that a wedge is seen in seconds, not five minutes: the control
a trial waits for is twenty times two polls and the trials end within the window, so the whole bound
scales with them (`workers.run_end.RunEnd`). At the defaults the same run is `benchmarks/bench_liveness.py`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.exit_codes import EXIT_FINISHED_WITH_DEAD_LETTERS
from tests.support import prompt_files
from tests.support.stack import README_WORKER_ENV, Stack, deployed_server
from tests.support.supervised_simulator import SupervisedSimulator
from workers.run_end import RunEnd
from workers.settings import WorkerSettings
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.poison import TrialBegun, decode_evidence

pytestmark = pytest.mark.integration

DROPS, HANGS, WEDGES = "POISON-DROPS", "POISON-HANGS", "POISON-WEDGES"
FAULTS = json.dumps({DROPS: "drop", HANGS: "hang", WEDGES: "wedge"})
SPEEDUP = 50.0  # the ordinary prompts take seconds; the tail is the poison's alone
PROMPTS = 60
BATCH = 16
GPUS = 2
# A wedge is seen after the liveness stall window (300 s by default); the simulator at this speedup moves
# its per-step counter every few milliseconds, so 3 s without progress is a hang beyond doubt, and polls
# of 0.25 s time it to within half a second (a trial's control: 20 x two polls = 10 s, not 200 s). A
# hanging request in company is cut after the silence limit (30 s by default): 5 s is still a hundred
# times a chunk's gap here.
NAMED = {
    "DRAFTGEN_LIVENESS_STALL_S": "3",
    "DRAFTGEN_LIVENESS_POLL_S": "0.25",
    "DRAFTGEN_SILENCE_LIMIT_S": "5",
}
SERVER_RESTART_S = 10.0  # a supervised simulator is back within this of its SIGKILL (~2 s measured)
ORDINARY_RUN_S = 60.0  # generating the 57 ordinary prompts alone, with room for a busy machine
FINISH_TIMEOUT_S = 900.0


@pytest.fixture
def gpus(tmp_path: Path) -> Iterator[list[SupervisedSimulator]]:
    settings = deployed_server(speedup=SPEEDUP, enable_metrics=True, prompt_faults=FAULTS)
    running = [
        SupervisedSimulator(lambda _life: settings, tmp_path / f"gpu{i}.pid").start() for i in range(GPUS)
    ]
    yield running
    for gpu in running:
        gpu.stop()


def bound_s(tried_alone: int) -> float:
    """The docs' bound for this run's settings: three poison prompts, and the others tried alone."""
    settings = WorkerSettings(
        liveness_stall_s=float(NAMED["DRAFTGEN_LIVENESS_STALL_S"]),
        liveness_poll_s=float(NAMED["DRAFTGEN_LIVENESS_POLL_S"]),
        silence_limit_s=float(NAMED["DRAFTGEN_SILENCE_LIMIT_S"]),
    )
    ends = RunEnd(settings=settings, server_restart_s=SERVER_RESTART_S)
    return ends.bound_s(poison=3, ordinary_suspects=tried_alone)


@pytest.mark.timeout(FINISH_TIMEOUT_S + 120)
def test_a_run_whose_last_prompts_are_poison_finishes_by_itself_within_its_bound(
    redis_url: str, log_dir: Path, gpus: list[SupervisedSimulator], tmp_path: Path
) -> None:
    # Given a run whose last three prompts drop their connection, hang, and wedge the server
    stack = Stack(
        redis_url,
        log_dir,
        gpus,  # type: ignore[arg-type]  # supervised simulators: the stack reads their urls
        extra_env={**README_WORKER_ENV, **NAMED},
        gpu_env={i: {"DRAFTGEN_SERVER_RESTART_COMMAND": gpu.restart_command()} for i, gpu in enumerate(gpus)},
    ).start()
    try:
        rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(PROMPTS, "tail")]
        for row, marker in zip(rows[-3:], (DROPS, HANGS, WEDGES), strict=True):
            row["prompt"] = f"{row['prompt']} {marker}"
        poison = {str(row["id"]) for row in rows[-3:]}
        run = "tail"
        started = time.monotonic()
        stack.enqueue(
            prompt_files.write_jsonl(tmp_path / "d.jsonl", rows),
            run,
            "--output",
            str(tmp_path / "out"),
            "--batch-size",
            str(BATCH),
        )
        # When the run goes on by itself, `wait` saying how it goes at least once a minute
        waited = stack.producer("wait", "--run", run, "--timeout", str(FINISH_TIMEOUT_S))
        took_s = time.monotonic() - started
        # Then it finished, the three dead-lettered as poison and every other prompt committed once
        assert waited.returncode == EXIT_FINISHED_WITH_DEAD_LETTERS, waited.stdout + waited.stderr
        client = redis.Redis.from_url(redis_url)
        ledger = RunLedger(client, run)
        letters = {letter.prompt_id: letter.reason for letter in ledger.dead_letters()}
        assert letters == dict.fromkeys(poison, "poison_prompt")
        assert ledger.counts().done == PROMPTS - 3
        result = stack.verify(run)
        assert result.returncode == 0, result.stdout + result.stderr
        # And within its bound: what generating the others takes, and the docs' bound for the poison and
        # for every other prompt that was tried alone
        records = {
            key.decode(): decode_evidence(raw) for key, raw in client.hgetall(RunKeys(run).strikes).items()
        }
        tried_alone = {p for p, events in records.items() if any(isinstance(e, TrialBegun) for e in events)}
        bound = ORDINARY_RUN_S + bound_s(len(tried_alone - poison))
        print(f"finished in {took_s:.0f} s, bound {bound:.0f} s; {len(tried_alone)} prompts tried alone")
        assert took_s <= bound
        lines = [line for line in waited.stdout.splitlines() if line.strip()]
        assert len(lines) >= took_s // 60, waited.stdout  # a line at least every minute
    finally:
        stack.stop()
