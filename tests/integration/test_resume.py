"""Resume without the visibility timeout: preemption, a frozen worker, a long batch, a Redis restart."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devstack.local_stack import ManagedProcess, free_port, start_redis, wait_until
from inference.simulator import SimulatorProcess
from tests.support import prompt_files
from tests.support.stack import Stack, simulators_running
from workers.broker.kombu_layout import waiting_messages
from workers.settings import DEFAULT_MAX_IN_FLIGHT, DEFAULT_SHUTDOWN_GRACE_S
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE, queue_lists

pytestmark = pytest.mark.integration

SPEEDUP = 20.0  # a request lasts seconds: well inside the shutdown grace, and a run lasts tens of seconds
EXIT_MARGIN_S = 15.0  # after the grace: handing batches back and Celery's own shutdown
FINISH_S = 240.0
# Leases scaled down (from 60 s, renewed every 10 s, reconciled every 15 s) where a test must outlive
# several of them: the mechanism is the same, the test takes seconds instead of minutes.
SHORT_LEASES = {
    "DRAFTGEN_LEASE_TTL_S": "4",
    "DRAFTGEN_LEASE_RENEW_S": "1",
    "DRAFTGEN_RECONCILE_INTERVAL_S": "1",
}
SHORT_LEASE_S = 4.0
SLOW_SPEEDUP = 5.0  # two rounds of 48 requests of ~2,300 tokens: far longer than three short leases


@pytest.fixture
def sims() -> Iterator[list[SimulatorProcess]]:
    with simulators_running(2, speedup=SPEEDUP, request_log_size=20_000) as running:
        yield running


def make_stack(redis_url: str, log_dir: Path, sims: list[SimulatorProcess], **env: str) -> Stack:
    return Stack(redis_url, log_dir, sims, extra_env={"DRAFTGEN_UPLOAD_MAX_COMPLETIONS": "1000", **env})


def generations(sims: list[SimulatorProcess], run: str) -> Counter[str]:
    return Counter(
        record.rid.split(":")[1]
        for sim in sims
        for record in sim.admin.requests()
        if record.status == "ok" and record.rid.startswith(run + ":")
    )


def enqueue(stack: Stack, tmp_path: Path, run: str, prompts: int, batch_size: int = 16) -> RunLedger:
    data = prompt_files.write_jsonl(
        tmp_path / f"{run}.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(prompts, run)]
    )
    stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--batch-size", str(batch_size))
    return RunLedger(redis.Redis.from_url(stack.redis_url), run)


def handed_over(ledger: RunLedger) -> int:
    counts = ledger.counts()
    return counts.staged + counts.done


def lease_holders(ledger: RunLedger) -> set[bytes]:
    return set(ledger.client.hvals(ledger.keys.lease_owners))


def test_a_sigtermed_worker_finishes_its_requests_in_flight_and_hands_every_batch_back_at_once(
    redis_url: str, log_dir: Path, sims: list[SimulatorProcess], tmp_path: Path
) -> None:
    # Given one generate worker in the middle of a run (README defaults: a 25 s grace)
    stack = make_stack(redis_url, log_dir, sims[:1])
    try:
        worker = stack.start_generator(0)
        stack.start_uploader()
        ledger = enqueue(stack, tmp_path, "preempted", 400)
        wait_until(lambda: handed_over(ledger) >= 60, timeout_s=60, what="60 completions handed over")
        assert lease_holders(ledger), "nothing was leased when the notice came"
        # When it gets SIGTERM (systemctl stop, a spot notice)
        os.killpg(worker.pid, signal.SIGTERM)
        assert worker.process is not None
        worker.process.wait(timeout=DEFAULT_SHUTDOWN_GRACE_S + EXIT_MARGIN_S)
        # Then it exits within the grace, holding no batch: every one is back in the queue
        assert not lease_holders(ledger)
        assert waiting_messages(ledger.client, GENERATE_QUEUE) > 0
        # And the batches it had begun wait in the list consumers pop first, before those not begun
        assert ledger.client.llen(queue_lists(GENERATE_QUEUE)[0]) > 0
        assert handed_over(ledger) < 400, "the run ended before the notice: nothing was handed back"
        # And another worker finishes the run with every prompt generated once: the requests in flight
        # finished within the grace and were kept
        stack.start_generator(0)
        stack.wait_finished("preempted", timeout_s=FINISH_S)
        assert stack.verify("preempted").returncode == 0
        assert set(generations(sims[:1], "preempted").values()) == {1}
    finally:
        stack.stop()


def test_a_worker_frozen_past_its_lease_loses_its_batches_and_wastes_at_most_its_requests_in_flight(
    redis_url: str, log_dir: Path, sims: list[SimulatorProcess], tmp_path: Path
) -> None:
    # Given two generate workers sharing a run, leases scaled down
    stack = make_stack(redis_url, log_dir, sims, **SHORT_LEASES)
    try:
        frozen = stack.start_generator(0)
        stack.start_generator(1)
        stack.start_uploader()
        ledger = enqueue(stack, tmp_path, "frozen", 600)
        wait_until(lambda: handed_over(ledger) >= 60, timeout_s=60, what="60 completions handed over")
        # When one is stopped (SIGSTOP) until its leases are taken over, then continued
        os.killpg(frozen.pid, signal.SIGSTOP)
        held = lease_holders(ledger)
        try:
            wait_until(
                lambda: not held & lease_holders(ledger),
                timeout_s=FINISH_S,
                what="every lease held at the freeze to be taken over",
            )
        finally:
            os.killpg(frozen.pid, signal.SIGCONT)
        stack.wait_finished("frozen", timeout_s=FINISH_S)
        # Then every prompt is committed once, and only its requests in flight were generated twice
        assert stack.verify("frozen").returncode == 0
        twice = sum(count - 1 for count in generations(sims, "frozen").values())
        assert twice <= DEFAULT_MAX_IN_FLIGHT
    finally:
        stack.stop()


@pytest.fixture
def slow_sim() -> Iterator[list[SimulatorProcess]]:
    with simulators_running(1, speedup=SLOW_SPEEDUP, request_log_size=20_000) as running:
        yield running


def test_a_batch_that_outlives_its_lease_many_times_over_is_never_dispatched_again(
    redis_url: str, log_dir: Path, slow_sim: list[SimulatorProcess], tmp_path: Path
) -> None:
    # Given one worker holding one batch of 96 prompts that lasts far longer than a (scaled-down) lease
    stack = make_stack(redis_url, log_dir, slow_sim, **SHORT_LEASES)
    sims = slow_sim
    try:
        worker = stack.start_generator(0)
        stack.start_uploader()
        started = time.monotonic()
        ledger = enqueue(stack, tmp_path, "long-batch", 96, batch_size=96)
        stack.wait_finished("long-batch", timeout_s=FINISH_S)
        # Then it ran for at least three leases, yet every prompt was generated exactly once
        assert time.monotonic() - started > 3 * SHORT_LEASE_S
        assert set(generations(sims, "long-batch").values()) == {1}
        assert "dispatching it again" not in worker.log_text() + _log(stack.uploader)
        assert ledger.counts().done == 96
    finally:
        stack.stop()


def _log(process: ManagedProcess | None) -> str:
    return process.log_text() if process is not None else ""


def test_a_redis_restart_under_load_loses_no_batch_with_the_default_settings(
    sims: list[SimulatorProcess], log_dir: Path, tmp_path: Path
) -> None:
    # Given a run under way against a redis-server of its own (AOF on, as shipped)
    port = free_port()
    server = start_redis(port, tmp_path / "redis-data", log_dir)
    stack = make_stack(server.url, log_dir, sims)
    try:
        stack.start()
        ledger = enqueue(stack, tmp_path, "redis-restart", 600)
        wait_until(lambda: handed_over(ledger) >= 100, timeout_s=60, what="100 completions handed over")
        # When Redis restarts under load
        server.stop()
        server = start_redis(port, tmp_path / "redis-data", log_dir / "restarted")  # a log of its own
        # Then the run finishes, every prompt committed once
        stack.wait_finished("redis-restart", timeout_s=FINISH_S)
        assert stack.verify("redis-restart").returncode == 0
    finally:
        stack.stop()
        server.stop()
