"""A GPU node cut off from Redis for two minutes loses nothing and commits nothing twice; its batches go to
the other GPU within a lease period (and one reconcile interval); once healed it takes work again with no
restart, and the other GPU's worker is not stopped.

Real processes and a real partition: GPU node A (its simulated server and its generate worker) runs in a
network namespace of its own, behind a router namespace that drops every packet both ways for two minutes
(devstack/partition.py: no reset, no FIN, as when a switch dies); Redis, GPU node B (server and worker)
and the uploader run on this host. The README's defaults (Redis's `tcp-keepalive 60`, leases of 60 s,
the reconciler every 15 s).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devstack.local_stack import (
    ManagedProcess,
    RedisProcess,
    celery_worker,
    free_port,
    redis_process,
    wait_until,
)
from devstack.partition import HOST_ADDRESS, NODE_ADDRESS, NodeBehindRouter, partition_supported
from inference.simulator import SimulatorProcess, SimulatorSettings
from tests.support import prompt_files
from tests.support.stack import Stack, deployed_server
from workers.recovery.leases import DEFAULT_LEASE_TTL_S, decode_holder
from workers.recovery.reconciler import DEFAULT_RECONCILE_INTERVAL_S
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger

pytestmark = pytest.mark.integration

RUN = "partition"
SPEEDUP = 5.0
PROMPTS = 1400
BATCH_SIZE = "16"
NODE_A, NODE_B = "node-a", "node-b"
LABEL_A = f"{NODE_A}/gpu0"
LABEL_B = f"{NODE_B}/gpu0"
CUT_S = 120.0  # the two minutes
HANDED_OVER_BEFORE_THE_CUT = 160
PROGRESS_WAIT_S = 120.0
# B takes A's batches once their leases run out and the reconciler dispatches them: within the lease
# period and one reconcile interval, and the seconds B takes to reach them in its queue
TAKE_OVER_SLACK_S = 15.0
TAKEN_OVER_WITHIN_S = DEFAULT_LEASE_TTL_S + DEFAULT_RECONCILE_INTERVAL_S + TAKE_OVER_SLACK_S
# A's consumer reconnects on Celery's 2 s, 4 s, ... 30 s steps, its state client within its retries
REJOIN_WITHIN_S = 60.0
FINISH_TIMEOUT_S = 600.0
POLL_S = 0.5
WORKER_START_S = 60.0


class SimulatorInNode(SimulatorProcess):
    """A simulated GPU server inside node A's namespace, listening on the node's address (its worker
    reaches it there without the router; this host reaches it through the router, as an admin would)."""

    def __init__(self, node: NodeBehindRouter, settings: SimulatorSettings) -> None:
        super().__init__(dataclasses.replace(settings, host=NODE_ADDRESS, port=free_port()), keep_port=True)
        self.node = node

    def command(self) -> list[str]:
        return self.node.inside(super().command())


@pytest.fixture
def node() -> Iterator[NodeBehindRouter]:
    refused = partition_supported()
    if refused is not None:
        pytest.skip(f"no network namespaces here: {refused}")
    with NodeBehindRouter("dg") as made:
        yield made


@pytest.fixture
def server(node: NodeBehindRouter, tmp_path: Path) -> Iterator[RedisProcess]:
    """Redis with the shipped config, reachable from node A through the router."""
    process = redis_process(free_port(), tmp_path / "redis", tmp_path)
    process.argv = [*process.argv, "--bind", f"127.0.0.1 {HOST_ADDRESS}"]
    process.start()
    process.wait_for_log("Ready to accept connections")
    yield process
    process.stop()


def start_worker_in_node(
    node: NodeBehindRouter, stack: Stack, sim: SimulatorProcess, url: str
) -> ManagedProcess:
    env = stack.env(
        DRAFTGEN_REDIS_URL=url, DRAFTGEN_SERVER_URL=sim.url, DRAFTGEN_GPU="0", DRAFTGEN_HOSTNAME=NODE_A
    )
    worker = celery_worker("gen-a", "generate", env, stack.log_dir)
    worker.argv = node.inside(worker.argv)
    worker.start().wait_for_log(" ready.", timeout_s=WORKER_START_S)
    stack.generators.append(worker)
    return worker


def batches_leased_by(client: redis.Redis, label: str) -> set[str]:
    owners = client.hgetall(RunKeys(RUN).lease_owners)
    held = set()
    for batch, raw in owners.items():
        holder = decode_holder(raw)
        if holder is not None and holder.worker == label:
            held.add(batch.decode())
    return held


def taken_over(client: redis.Redis, batches: set[str]) -> bool:
    """Every one of `batches` is leased by node B's worker, or finished (A can finish nothing while cut)."""
    keys = RunKeys(RUN)
    still_a = batches & batches_leased_by(client, LABEL_A)
    open_batches = {raw.decode() for raw in client.zrange(keys.open_batches, 0, -1)}
    with_b = batches_leased_by(client, LABEL_B)
    return not still_a and all(batch in with_b or batch not in open_batches for batch in batches)


def requests_after(sim: SimulatorProcess, moment: float) -> int:
    return sum(1 for record in sim.admin.requests() if record.received_at > moment)


def test_a_gpu_node_cut_off_for_two_minutes_loses_nothing_and_rejoins_without_a_restart(
    node: NodeBehindRouter, server: RedisProcess, tmp_path: Path, log_dir: Path
) -> None:
    # Given GPU nodes A (behind the router) and B each running a batch of the same run, README defaults
    settings = deployed_server(enable_metrics=True, speedup=SPEEDUP)
    sim_a, sim_b = SimulatorInNode(node, settings).start(), SimulatorProcess(settings).start()
    stack = Stack(server.url, log_dir, [sim_b], fast=False, extra_env={"DRAFTGEN_HOSTNAME": NODE_B})
    try:
        stack.start_generator(0)
        worker_a = start_worker_in_node(node, stack, sim_a, server.url.replace("127.0.0.1", HOST_ADDRESS))
        worker_b = stack.generators[0]
        stack.start_uploader()
        rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(PROMPTS, "cut")]
        data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
        stack.enqueue(data, RUN, "--output", str(tmp_path / "out"), "--batch-size", BATCH_SIZE)
        client = redis.Redis.from_url(server.url)
        ledger = RunLedger(client, RUN)
        wait_until(
            lambda: (
                ledger.counts().remaining <= PROMPTS - HANDED_OVER_BEFORE_THE_CUT
                and bool(batches_leased_by(client, LABEL_A))
            ),
            timeout_s=PROGRESS_WAIT_S,
            what="both nodes at work",
        )

        # When node A is cut off from Redis (and from everything but its own server) for two minutes
        held_by_a = batches_leased_by(client, LABEL_A)
        remaining_at_the_cut = ledger.counts().remaining
        node.cut()
        cut_at = time.monotonic()
        # Then B takes A's batches within a lease period and a reconcile interval
        wait_until(lambda: taken_over(client, held_by_a), timeout_s=CUT_S, what="B to take A's batches")
        taken_after_s = time.monotonic() - cut_at
        wait_until(lambda: time.monotonic() - cut_at >= CUT_S, timeout_s=CUT_S, what="two minutes")
        generated_during_the_cut = remaining_at_the_cut - ledger.counts().remaining
        node.heal()
        healed_at, healed_wall = time.monotonic(), time.time()

        # And once healed, A's worker (the same process: no restart) takes work again, and B's is not stopped
        wait_until(
            lambda: requests_after(sim_a, healed_wall) > 0, timeout_s=REJOIN_WITHIN_S, what="A to rejoin"
        )
        rejoined_after_s = time.monotonic() - healed_at
        assert worker_a.alive() and worker_b.alive()
        # And the run finishes with every prompt committed exactly once
        stack.wait_finished(RUN, timeout_s=FINISH_TIMEOUT_S)
        assert worker_a.alive() and worker_b.alive()
        result = stack.verify(RUN)
        assert result.returncode == 0, result.stdout + result.stderr
        print(
            f"A held {len(held_by_a)} batches at the cut; B had taken every one {taken_after_s:.1f} s after "
            f"the cut; {generated_during_the_cut} prompts handed over during the cut, by B; A took work "
            f"again {rejoined_after_s:.1f} s after the network healed"
        )
        assert taken_after_s <= TAKEN_OVER_WITHIN_S, taken_after_s
    finally:
        stack.stop()
        sim_a.stop()
        sim_b.stop()
