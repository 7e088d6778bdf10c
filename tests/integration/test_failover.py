"""The fleet outlives its Redis primary: every process is given the Sentinels' addresses, and a failover in
the middle of a run loses no prompt and commits none twice.

Real processes: a primary and a replica redis-server and three Sentinels on loopback, set up as
deploy/multi-node.md sets up a fleet's (TLS only, the ACL users of deploy/redis-users.acl on every server,
the replication and Sentinel users included, each process from a config file of its own: a failover
rewrites them; tests/support/sentinel_group.py), two simulated GPUs with a generate worker each and the
uploader, each process given its own user's `sentinel://` URL as DRAFTGEN_REDIS_URL, with the README's
defaults otherwise.
"""

from __future__ import annotations

import enum
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devstack.local_stack import ManagedProcess, flower_process, free_port, http_ok, wait_until, worker_env
from inference.simulator import RequestRecord
from tests.support import prompt_files
from tests.support.redis_head import GPU_NODES, RoleStack, node_user
from tests.support.sentinel_group import MASTER_NAME, SentinelGroup, sentinel_group
from tests.support.stack import simulators
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE, UPLOAD_QUEUE
from workers.state.redis_client import connect

pytestmark = pytest.mark.integration

SPEEDUP = 20.0
GPUS = 2
PROMPTS = 1200
BATCH_SIZE = "16"
HANDED_OVER_BEFORE_THE_KILL = 300  # of 1200: the GPUs have most of the run still to generate
RUN = "failover"
FINISH_TIMEOUT_S = 180.0
SLOTS_WINDOW_S = 10.0
# The GPUs go on within 30 s of the new primary's election (the bound): each is back to this share of
# the requests it ran in the 10 s before the kill (measured: 1.8-3.2 s after the election; the workers'
# consumers reconnect on Celery's 2 s, 4 s, ... steps)
BACK_TO_SHARE = 0.8
GO_ON_WITHIN_S = 30.0
SAMPLE_STEP_S = 0.25
PROMPT_WAIT_S = 60.0
SERVICE_START_S = 30.0


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with sentinel_group(tmp_path / "redis") as running:
        yield running


@pytest.fixture
def stack(group: SentinelGroup, log_dir: Path) -> Iterator[RoleStack]:
    sims = simulators(GPUS, speedup=SPEEDUP)
    urls, node = group.urls, GPU_NODES[0]
    stack = RoleStack(
        urls["producer"],
        log_dir,
        sims,
        fast=False,  # the README's defaults
        worker_url=urls[node_user(node)],
        worker_host=node,
        uploader_url=urls["uploader"],
    )
    try:
        yield stack
    finally:
        stack.stop()
        for sim in sims:
            sim.stop()


class PrimaryFault(enum.Enum):
    KILLED = "killed"  # SIGKILL: every connection to it closes at once
    KILLED_BEHIND = "killed-replica-behind"  # the same, its replica lacking its last writes
    FROZEN = "frozen"  # SIGSTOP: every connection stays open and nothing answers, as across a partition


@pytest.mark.parametrize("fault", list(PrimaryFault), ids=[fault.value for fault in PrimaryFault])
def test_a_failover_mid_run_loses_no_prompt_and_commits_none_twice(
    group: SentinelGroup, stack: RoleStack, tmp_path: Path, fault: PrimaryFault
) -> None:
    # Given a run under way through the Sentinels' primary, a quarter of it generated
    stack.start()
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(PROMPTS, "fo")]
    )
    enqueued = stack.enqueue(data, RUN, "--output", str(tmp_path / "out"), "--batch-size", BATCH_SIZE)
    assert "replicated          every claim on 1 of 1 replica\n" in enqueued  # before enqueue ended
    ledger = RunLedger(connect(stack.redis_url), RUN)  # retried through the failover, as a worker's
    wait_until(
        lambda: ledger.counts().remaining <= PROMPTS - HANDED_OVER_BEFORE_THE_KILL,
        timeout_s=PROMPT_WAIT_S,
        what=f"{HANDED_OVER_BEFORE_THE_KILL} prompts generated",
    )
    remaining_at_the_kill = ledger.counts().remaining

    # When the primary is SIGKILLed (with its replica some writes behind, in one case), or frozen with every
    # connection to it open, and the Sentinels promote the replica
    old_primary = group.primary_port()
    replica = next(port for port in group.servers if port != old_primary)
    # FUNCTION LIST answers a flat [name, value, ...] list per library
    libraries = [
        dict(zip(entry[::2], entry[1::2], strict=True))[b"library_name"]
        for entry in group.server(replica).function_list()
    ]
    assert any(name.startswith(b"draftgen_") for name in libraries), libraries  # replicated with the data
    lost_bytes = group.cut_replicas_off(old_primary) if fault is PrimaryFault.KILLED_BEHIND else 0
    if fault is PrimaryFault.FROZEN:
        group.freeze(old_primary)
    else:
        group.kill(old_primary)
    killed_at, killed_at_wall = time.monotonic(), time.time()
    new_primary = group.wait_failover_from(old_primary)
    elected_at_wall = time.time()
    assert new_primary != old_primary
    if fault is PrimaryFault.KILLED_BEHIND:
        group.restore_replica_auth()

    # Then the run finishes by itself, with no process restarted, and every prompt is committed once
    stack.wait_finished(RUN, timeout_s=FINISH_TIMEOUT_S)
    finished_after_s = time.monotonic() - killed_at
    assert all(process.alive() for process in [*stack.generators, stack.uploader] if process is not None)
    result = stack.verify(RUN)
    assert result.returncode == 0, result.stdout + result.stderr
    # And status says where the primary is now, and that it failed over
    status = stack.producer("status", "--run", RUN)
    assert status.returncode == 0, status.stderr
    assert f"at 127.0.0.1:{new_primary}, as 3 of 3 Sentinels say; 1 failover" in status.stdout, status.stdout

    # And no user (the processes', the replication's, the Sentinels') was refused anything on the new primary
    assert group.refusals(new_primary) == []
    assert group.sentinel_refusals() == []  # each process logs in to the Sentinels too

    # And the GPUs went on once the new primary was elected (while the Sentinels judged the primary down,
    # 5 s, they ran the batches they held: those need no Redis to be sent)
    busy: list[tuple[float, float, float]] = []
    for sim in stack.sims:
        records = sim.admin.requests()
        before = busy_slots(records, killed_at_wall - SLOTS_WINDOW_S, killed_at_wall)
        between = busy_slots(records, killed_at_wall, elected_at_wall)
        back_after_s = time_back_to(records, BACK_TO_SHARE * before, elected_at_wall) - elected_at_wall
        busy.append((before, between, back_after_s))
    print(
        f"failover to {new_primary} elected {elected_at_wall - killed_at_wall:.1f} s after the kill, "
        f"{lost_bytes} bytes of writes lost with the primary; {remaining_at_the_kill} prompts still to "
        f"generate at the kill; finished {finished_after_s:.1f} s after it; per GPU, requests running in the "
        f"{SLOTS_WINDOW_S:.0f} s before the kill, until the election, and how long after it the GPU was back "
        f"to {BACK_TO_SHARE:.0%} of them: "
        + ", ".join(f"{before:.1f} / {between:.1f} / {back:.1f} s" for before, between, back in busy)
    )
    assert all(back <= GO_ON_WITHIN_S for _, _, back in busy), busy
    assert (lost_bytes > 0) == (fault is PrimaryFault.KILLED_BEHIND)  # the case's, not by chance


def time_back_to(records: list[RequestRecord], level: float, since: float) -> float:
    """The first moment from `since` (Unix seconds) at which the server held at least `level` requests."""
    last = max(record.finished_at or record.received_at for record in records)
    moment = since
    while moment <= last:
        held = sum(
            1 for record in records if record.received_at <= moment < (record.finished_at or float("inf"))
        )
        if held >= level:
            return moment
        moment += SAMPLE_STEP_S
    return float("inf")


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
    urls = group.urls
    env = worker_env(urls["flower"], {"FLOWER_UNAUTHENTICATED_API": "true", "DRAFTGEN_FLOWER_OPEN_API": "1"})
    flower_port, metrics_port = free_port(), free_port()
    flower = flower_process(flower_port, env, log_dir).start()
    exporter = ManagedProcess(
        "metrics",
        [sys.executable, "-m", "producer", "metrics", "--port", str(metrics_port)],
        log_dir / "metrics.log",
        env=worker_env(urls["producer"], {}),
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


@pytest.mark.parametrize(
    "command",
    [
        ("SENTINEL", "FAILOVER", MASTER_NAME),
        ("SENTINEL", "REMOVE", MASTER_NAME),
        ("SENTINEL", "SET", MASTER_NAME, "quorum", "1"),
        ("SENTINEL", "RESET", "*"),
        ("SENTINEL", "MONITOR", "other", "127.0.0.1", "6379", "1"),
        ("SENTINEL", "CONFIG", "SET", "resolve-hostnames", "no"),
        ("SHUTDOWN",),
    ],
)
def test_a_gpu_node_s_user_may_ask_the_sentinels_where_the_primary_is_and_nothing_more(
    group: SentinelGroup, command: tuple[str, ...]
) -> None:
    sentinel = group.sentinel(next(iter(group.sentinels)), user=node_user(GPU_NODES[0]))
    assert sentinel.sentinel_get_master_addr_by_name(MASTER_NAME) is not None
    with pytest.raises(redis.exceptions.NoPermissionError):
        sentinel.execute_command(*command)
    assert group.primary_port() == group.first_primary  # nothing failed over


def test_the_sentinels_refuse_anyone_without_a_login(group: SentinelGroup) -> None:
    port = next(iter(group.sentinels))
    anonymous = redis.Redis(
        host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(group.certificates.ca_cert), socket_timeout=1
    )
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.execute_command("SENTINEL", "REMOVE", MASTER_NAME)
