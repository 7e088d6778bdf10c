"""The fleet outlives its Redis primary: every process is given the Sentinels' addresses, and a failover in
the middle of a run loses no prompt and commits none twice.

Real processes: a primary and a replica redis-server and three Sentinels on loopback (each from a config
file of its own: a failover rewrites them), a simulated GPU, a generate worker and the uploader, all given
the same `sentinel://` URL as DRAFTGEN_REDIS_URL, with the README's defaults otherwise.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.local_stack import ManagedProcess, flower_process, free_port, http_ok, wait_until, worker_env
from inference.simulator import RequestRecord
from tests.support import prompt_files
from tests.support.sentinel_group import SentinelGroup, sentinel_group
from tests.support.stack import Stack, simulators
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE, UPLOAD_QUEUE
from workers.state.redis_client import connect

pytestmark = pytest.mark.integration

SPEEDUP = 20.0
PROMPTS = 600
BATCH_SIZE = "16"
HANDED_OVER_BEFORE_THE_KILL = 150  # of 600: the GPU has most of the run still to generate
RUN = "failover"
FINISH_TIMEOUT_S = 180.0
SLOTS_WINDOW_S = 10.0
# Of the requests the GPU ran before the kill, over the same span after it (0.8-1.1 measured).
BUSY_THROUGH_THE_FAILOVER = 0.7
PROMPT_WAIT_S = 60.0
SERVICE_START_S = 30.0


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with sentinel_group(tmp_path / "redis") as running:
        yield running


@pytest.fixture
def stack(group: SentinelGroup, log_dir: Path) -> Iterator[Stack]:
    sims = simulators(1, speedup=SPEEDUP)
    stack = Stack(group.url, log_dir, sims, fast=False)  # the README's defaults
    try:
        yield stack
    finally:
        stack.stop()
        for sim in sims:
            sim.stop()


@pytest.mark.parametrize("replica_behind", [False, True], ids=["replica-in-sync", "replica-behind"])
def test_a_failover_mid_run_loses_no_prompt_and_commits_none_twice(
    group: SentinelGroup, stack: Stack, tmp_path: Path, replica_behind: bool
) -> None:
    # Given a run under way through the Sentinels' primary, a quarter of it generated
    stack.start()
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(PROMPTS, "fo")]
    )
    stack.enqueue(data, RUN, "--output", str(tmp_path / "out"), "--batch-size", BATCH_SIZE)
    ledger = RunLedger(connect(group.url), RUN)  # retried through the failover, as a worker's
    wait_until(
        lambda: ledger.counts().remaining <= PROMPTS - HANDED_OVER_BEFORE_THE_KILL,
        timeout_s=PROMPT_WAIT_S,
        what=f"{HANDED_OVER_BEFORE_THE_KILL} prompts generated",
    )
    remaining_at_the_kill = ledger.counts().remaining

    # When the primary is SIGKILLed (with its replica some writes behind, in one case) and the Sentinels
    # promote the replica
    old_primary = group.primary_port()
    replica = next(port for port in group.servers if port != old_primary)
    # FUNCTION LIST answers a flat [name, value, ...] list per library
    libraries = [
        dict(zip(entry[::2], entry[1::2], strict=True))[b"library_name"]
        for entry in group.server(replica).function_list()
    ]
    assert any(name.startswith(b"draftgen_") for name in libraries), libraries  # replicated with the data
    lost_bytes = group.cut_replicas_off(old_primary) if replica_behind else 0
    group.kill(old_primary)
    killed_at, killed_at_wall = time.monotonic(), time.time()
    new_primary = group.wait_failover_from(old_primary)
    assert new_primary != old_primary
    group.restore_replica_auth()

    # Then the run finishes by itself, with no process restarted, and every prompt is committed once
    stack.wait_finished(RUN, timeout_s=FINISH_TIMEOUT_S)
    assert all(process.alive() for process in [*stack.generators, stack.uploader] if process is not None)
    result = stack.verify(RUN)
    assert result.returncode == 0, result.stdout + result.stderr
    # And status says where the primary is now, and that it failed over
    status = stack.producer("status", "--run", RUN)
    assert status.returncode == 0, status.stderr
    assert f"at 127.0.0.1:{new_primary}, as 3 of 3 Sentinels say; 1 failover" in status.stdout, status.stdout

    # And the GPU was kept busy through the failover (the batches it held need no Redis to be sent)
    records = stack.sims[0].admin.requests()
    before = busy_slots(records, killed_at_wall - SLOTS_WINDOW_S, killed_at_wall)
    after = busy_slots(records, killed_at_wall, killed_at_wall + SLOTS_WINDOW_S)
    print(
        f"failover to {new_primary}, {lost_bytes} bytes of writes lost with the primary; "
        f"{remaining_at_the_kill} prompts still to generate at the kill; "
        f"finished {time.monotonic() - killed_at:.1f} s after it; requests running: {before:.1f} in the "
        f"{SLOTS_WINDOW_S:.0f} s before the kill, {after:.1f} in the {SLOTS_WINDOW_S:.0f} s after"
    )
    assert after >= BUSY_THROUGH_THE_FAILOVER * before, (before, after)
    assert (lost_bytes > 0) == replica_behind  # the writes lost are the case's, not by chance


def busy_slots(records: list[RequestRecord], start: float, end: float) -> float:
    """The mean number of requests the server held between `start` and `end` (Unix seconds)."""
    held = sum(
        max(0.0, min(end, record.finished_at or end) - max(start, record.received_at)) for record in records
    )
    return held / (end - start)


def test_flower_and_the_metrics_exporter_reach_redis_through_its_sentinels(
    group: SentinelGroup, log_dir: Path
) -> None:
    # Given Flower and the metrics exporter given the Sentinels' URL, as every other process is
    env = worker_env(group.url, {"FLOWER_UNAUTHENTICATED_API": "true", "DRAFTGEN_FLOWER_OPEN_API": "1"})
    flower_port, metrics_port = free_port(), free_port()
    flower = flower_process(flower_port, env, log_dir).start()
    exporter = ManagedProcess(
        "metrics",
        [sys.executable, "-m", "producer", "metrics", "--port", str(metrics_port)],
        log_dir / "metrics.log",
        env=env,
    ).start()
    flower_url, metrics_url = f"http://127.0.0.1:{flower_port}", f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        flower.wait_ready(lambda: http_ok(f"{flower_url}/healthcheck"), timeout_s=SERVICE_START_S)
        exporter.wait_ready(lambda: http_ok(metrics_url), timeout_s=SERVICE_START_S)
        # Then Flower's Broker figures list both queues, read on the primary the Sentinels name
        with urllib.request.urlopen(f"{flower_url}/api/queues/length", timeout=SERVICE_START_S) as response:
            queues = {queue["name"] for queue in json.load(response)["active_queues"]}
        assert {GENERATE_QUEUE, UPLOAD_QUEUE} <= queues
        # And the exporter reaches Redis
        with urllib.request.urlopen(metrics_url, timeout=SERVICE_START_S) as response:
            assert "draftgen_redis_up 1.0" in response.read().decode()
    finally:
        flower.stop()
        exporter.stop()
