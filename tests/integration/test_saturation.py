"""Slots stay full under long-tailed lengths: a batch's longest request does not hold its worker's
next batch back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from core.records import SamplingSettings
from inference.simulator import predict_outcome
from tests.support import prompt_files
from tests.support.stack import Stack, deployed_server, simulators

pytestmark = pytest.mark.integration

SPEEDUP = 20.0
BATCH_SIZE = 4
CANDIDATES = 200
LONG_OVER_SHORT = 5  # the long request lasts at least this many times the short ones


def test_a_worker_takes_its_next_batch_while_the_last_request_of_the_previous_one_still_runs(
    redis_url: str, log_dir: Path, tmp_path: Path
) -> None:
    # Given prompts whose output lengths the server will give are known: one long, the rest short
    settings = deployed_server(speedup=SPEEDUP, enable_metrics=True, request_log_size=1_000)
    budget = SamplingSettings().max_tokens
    rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(CANDIDATES, "tail")]
    length = {
        str(row["id"]): predict_outcome(
            settings, [{"role": "user", "content": row["prompt"]}], budget
        ).completion_tokens
        for row in rows
    }
    by_length = sorted(rows, key=lambda row: length[str(row["id"])])
    long, shorts = by_length[-1], by_length[: 2 * BATCH_SIZE - 1]
    assert length[str(long["id"])] > LONG_OVER_SHORT * max(length[str(row["id"])] for row in shorts)
    first_batch, second_batch = [long, *shorts[: BATCH_SIZE - 1]], shorts[BATCH_SIZE - 1 :]
    # And a worker that holds one batch at a time
    sim = simulators(1, speedup=SPEEDUP, request_log_size=1_000)[0]
    stack = Stack(redis_url, log_dir, [sim], extra_env={"DRAFTGEN_BATCHES_IN_FLIGHT": "1"}).start()
    try:
        # When both batches are enqueued and the run finishes
        data = prompt_files.write_jsonl(tmp_path / "d.jsonl", [*first_batch, *second_batch])
        stack.enqueue(data, "tail", "--output", str(tmp_path / "out"), "--batch-size", str(BATCH_SIZE))
        stack.wait_finished("tail")
        # Then the second batch was at the server before the first batch's long request finished
        records = {
            record.rid.split(":")[1]: record for record in sim.admin.requests() if record.status == "ok"
        }
        long_finished_at = records[str(long["id"])].finished_at
        assert long_finished_at is not None
        assert max(records[str(row["id"])].received_at for row in second_batch) < long_finished_at
        # And every prompt was generated once, the run verified
        generated = Counter(
            record.rid.split(":")[1] for record in sim.admin.requests() if record.status == "ok"
        )
        assert set(generated.values()) == {1} and len(generated) == 2 * BATCH_SIZE
        assert stack.verify("tail").returncode == 0
    finally:
        stack.stop()
        sim.stop()
