"""A run with poison prompts finishes by itself: two prompts make the server drop the connection every
time they are sent, one makes it hang; all three are dead-lettered with what happened, the other 117
are committed once, `status` says finished only then, and the output alone proves it.

Real processes throughout: redis-server, two simulated GPUs whose faults are keyed by prompt content,
two generate workers and an uploader, with the README's defaults but three. The silence limit, a hung
request's deadline in company, is 10 s instead of 30 s so the hang costs this test a minute, not three.
A suspect alone is judged with the liveness stall window (300 s) and waits for 20 liveness polls (100 s)
of control before each trial: a 5 s window and a 0.25 s poll (the simulator at speedup 50 moves its
per-step counter every few milliseconds) prove the three in minutes, not half an hour.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devstack.local_stack import wait_until
from inference.simulator import SimulatorProcess
from producer.status.figures import STATE_FINISHED
from producer.status.gather import gather_status
from tests.support import prompt_files
from tests.support.stack import README_WORKER_ENV, Stack, simulators
from workers.state.ledger import RunLedger

pytestmark = pytest.mark.integration

DROPS, HANGS = "POISON-DROP", "POISON-HANG"
PROMPTS = 120
SPEEDUP = 50.0
SILENCE_LIMIT_S = "10"
LIVENESS = {"DRAFTGEN_LIVENESS_STALL_S": "5", "DRAFTGEN_LIVENESS_POLL_S": "0.25"}
FINISH_S = 420.0


@pytest.fixture
def sims() -> Iterator[list[SimulatorProcess]]:
    faults = json.dumps({DROPS: "drop", HANGS: "hang"})
    running = simulators(2, speedup=SPEEDUP, prompt_faults=faults)
    yield running
    for sim in running:
        sim.stop()


@pytest.fixture
def stack(redis_url: str, log_dir: Path, sims: list[SimulatorProcess]) -> Iterator[Stack]:
    running = Stack(
        redis_url,
        log_dir,
        sims,
        extra_env={**README_WORKER_ENV, **LIVENESS, "DRAFTGEN_SILENCE_LIMIT_S": SILENCE_LIMIT_S},
    )
    yield running.start()
    running.stop()


def poisoned_questions() -> tuple[list[dict[str, object]], set[str]]:
    rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(PROMPTS, "poison")]
    for index, marker in ((7, DROPS), (50, DROPS), (93, HANGS)):
        rows[index]["prompt"] = f"{rows[index]['prompt']} {marker}"
    return rows, {str(rows[index]["id"]) for index in (7, 50, 93)}


def test_poison_prompts_are_dead_lettered_with_what_happened_and_the_run_finishes_by_itself(
    stack: Stack, tmp_path: Path
) -> None:
    rows, poisoned = poisoned_questions()
    data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
    output = tmp_path / "out"
    run = "poisoned"
    stack.enqueue(data, run, "--output", str(output))
    client = redis.Redis.from_url(stack.redis_url)
    ledger = RunLedger(client, run)
    said_finished_early: list[object] = []

    def finished() -> bool:
        counts = ledger.counts()
        status = gather_status(client, run)
        if status.state == STATE_FINISHED and (counts.done, counts.dead) != (PROMPTS - 3, 3):
            said_finished_early.append(status.progress)
        return status.state == STATE_FINISHED

    wait_until(finished, timeout_s=FINISH_S, what="the poisoned run to finish by itself")

    assert said_finished_early == []
    letters = {letter.prompt_id: letter for letter in ledger.dead_letters()}
    assert set(letters) == poisoned
    for letter in letters.values():
        assert letter.reason == "poison_prompt"
        assert letter.error.startswith(
            "no answer alone 3 times, the server answering a canary before and after"
        )
    hung = letters[str(rows[93]["id"])].error
    alone_silent = hung.count("the server stopped making progress") + hung.count(
        "it was silent while the server"
    )
    assert alone_silent == 3, hung
    assert all(
        letters[str(rows[i]["id"])].error.count("its connection dropped while the server still answered") == 3
        for i in (7, 50)
    )
    without_redis = stack.producer(
        "verify", "--run", run, "--output", str(output), DRAFTGEN_REDIS_URL="redis://127.0.0.1:1/0"
    )
    assert without_redis.returncode == 0, without_redis.stdout + without_redis.stderr
    assert f"committed         {PROMPTS - 3} in" in without_redis.stdout
    assert "dead-lettered     3 (3 committed to the output)" in without_redis.stdout
