"""SIGKILL of a generate worker mid-batch and of the uploader mid-flush: nothing lost, nothing twice."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from core.exit_codes import EXIT_USAGE
from devstack.local_stack import celery_worker, wait_until
from inference.simulator import SimulatorProcess
from producer.upkeep.gc import collect_orphans
from tests.support import prompt_files
from tests.support.stack import Stack, simulators_running
from workers.bootsteps.seating import EXIT_SEAT_HELD
from workers.record.manifest import DATA_PREFIX, completion_keys, read_manifest
from workers.record.parquet_io import prompt_ids_in
from workers.record.storage import open_store
from workers.recovery.leases import decode_holder
from workers.state.keys import seat_key
from workers.state.ledger import RunLedger

pytestmark = pytest.mark.integration

SLOW_SPEEDUP = 60.0  # a batch lasts seconds, so a kill lands in the middle of one
RESUME_PROMISED_S = 120  # design: a lost worker's batches are back in the queue within 2 minutes
FINISH_AFTER_KILL_S = 240
UPLOAD_LOCK_S = "5"


@pytest.fixture
def sims() -> Iterator[list[SimulatorProcess]]:
    with simulators_running(1, speedup=SLOW_SPEEDUP, request_log_size=20_000) as running:
        yield running


@pytest.fixture
def stack(redis_url: str, log_dir: Path, sims: list[SimulatorProcess]) -> Iterator[Stack]:
    running = Stack(
        redis_url,
        log_dir,
        sims,
        extra_env={
            "DRAFTGEN_UPLOAD_MAX_COMPLETIONS": "1000",
            # an uploader killed mid-flush holds the run's flush lock until its lease ends
            "DRAFTGEN_UPLOAD_LOCK_S": UPLOAD_LOCK_S,
        },
    )
    yield running
    running.stop()


def ok_generations(sim: SimulatorProcess, run: str) -> Counter[str]:
    return Counter(
        record.rid.split(":")[1]
        for record in sim.admin.requests()
        if record.status == "ok" and record.rid.startswith(run + ":")
    )


def handed_over(ledger: RunLedger) -> set[str]:
    client = ledger.client
    done = {raw.decode() for raw in client.smembers(ledger.keys.done)}
    staged = {raw.decode() for raw in client.zrange(ledger.keys.staged_index, 0, -1)}
    return done | staged


def a_run_under_way_on_one_gpu(stack: Stack, tmp_path: Path, run: str) -> RunLedger:
    """A run of 160 prompts on GPU 0, 30 of them handed over already."""
    stack.start_generator(0)
    stack.start_uploader()
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(160, run)]
    )
    stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--batch-size", "16")
    ledger = RunLedger(redis.Redis.from_url(stack.redis_url), run)
    wait_until(lambda: len(handed_over(ledger)) >= 30, timeout_s=60, what="30 completions handed over")
    return ledger


def test_a_generate_worker_killed_mid_batch_loses_only_its_requests_in_flight(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a run in progress on one GPU
    run = "kill-generate"
    ledger = a_run_under_way_on_one_gpu(stack, tmp_path, run)
    # When its worker is SIGKILLed mid-batch, then started again
    held_by_the_killed = set(ledger.client.hvals(ledger.keys.lease_owners))
    stack.generators[0].kill()
    before_kill = handed_over(ledger)
    assert len(before_kill) < 160, "the kill came too late to land mid-run"
    assert held_by_the_killed, "the kill came when no batch was leased"
    stack.start_generator(0)
    # Then the batches it held are dispatched again within two minutes, with the default settings
    wait_until(
        lambda: not held_by_the_killed & set(ledger.client.hvals(ledger.keys.lease_owners)),
        timeout_s=RESUME_PROMISED_S,
        what="the killed worker's leases to be taken back",
    )
    stack.wait_finished(run, timeout_s=FINISH_AFTER_KILL_S)
    # And verify passes, and no completion handed over before the kill was generated again
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout
    generations = ok_generations(stack.sims[0], run)
    assert {prompt_id: generations[prompt_id] for prompt_id in before_kill} == dict.fromkeys(before_kill, 1)


def test_an_uploader_killed_mid_flush_commits_everything_once_and_gc_removes_its_orphan(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a run whose manifest cannot be written yet (a file sits where the manifest folder goes,
    # placed once enqueue made the output: a new run's output holds nothing but its own files), so the
    # uploader's flush writes its data object and fails before committing it
    # The uploader is up before the GPU's worker starts, so that its flushes land while the run goes on:
    # each retry writes an object of more completions, and of two written, one at least is never committed
    # (a retry of the same completions writes the same object: its key is its checksum)
    output = tmp_path / "out"
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(200, "up")]
    )
    run = "kill-uploader"
    stack.enqueue(data, run, "--output", str(output), "--batch-size", "16")
    (output / "manifest").write_text("in the way")
    stack.start_uploader()
    stack.start_generator(0)
    store = open_store(output.as_uri())
    wait_until(lambda: len(list(store.list(DATA_PREFIX))) >= 2, timeout_s=60, what="two data objects written")
    # When the uploader is SIGKILLed mid-flush, the obstacle is removed, and the uploader restarts
    assert stack.uploader is not None
    stack.uploader.kill()
    written_before_kill = {info.key for info in store.list(DATA_PREFIX)}
    assert RunLedger(redis.Redis.from_url(stack.redis_url), run).counts().done == 0
    (output / "manifest").unlink()
    stack.start_uploader()
    stack.wait_finished(run, timeout_s=120)
    # Then every prompt is committed exactly once
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout
    # And the object of the interrupted flush is an orphan that gc removes, leaving verify green
    committed = {entry.key for entry in read_manifest(store)}
    orphans = written_before_kill - committed
    assert orphans
    report = collect_orphans(store)
    assert set(report.removed) == orphans
    assert stack.verify(run).returncode == 0


def test_losing_redis_loses_no_committed_work_one_recover_command_finishes_the_run(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a run half-way, some of it committed
    output = tmp_path / "out"
    stack.start_generator(0)
    stack.start_uploader()
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(160, "lost")]
    )
    run = "lost-redis"
    stack.enqueue(data, run, "--output", str(output), "--batch-size", "16")
    client = redis.Redis.from_url(stack.redis_url)
    ledger = RunLedger(client, run)
    wait_until(lambda: ledger.counts().done >= 40, timeout_s=60, what="40 prompts committed")
    # When every process stops and Redis loses everything
    for process in [*stack.generators, stack.uploader]:
        assert process is not None
        process.kill()
    store = open_store(output.as_uri())
    committed_before = {
        pid for key in completion_keys(read_manifest(store)) for pid in prompt_ids_in(store.get(key))
    }
    assert 40 <= len(committed_before) < 160
    client.flushdb()
    # Then one command naming a missing input refuses before it writes anything
    refused = stack.producer("recover", "--run", run, "--output", str(output), "--requeue", "nope.jsonl")
    assert refused.returncode == EXIT_USAGE, refused.stderr
    assert "nope.jsonl" in refused.stderr and "Traceback" not in refused.stderr
    assert client.dbsize() == 0
    # And with the run's data, it rebuilds the committed state from the output alone and queues only what
    # was never committed
    recovered = stack.producer("recover", "--run", run, "--output", str(output), "--requeue", str(data))
    assert recovered.returncode == 0, recovered.stderr
    assert ledger.counts().done == len(committed_before)
    assert f"requeued            {160 - len(committed_before)} " in recovered.stdout, recovered.stdout
    # And the workers started again finish the run, each prompt committed once
    stack.start_generator(0)
    stack.start_uploader()
    stack.wait_finished(run, timeout_s=120)
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout
    generations = ok_generations(stack.sims[0], run)
    assert {pid: generations[pid] for pid in committed_before} == dict.fromkeys(committed_before, 1)


TAKEN_BACK_WITHIN_S = 20.0  # worker start-up included; the leases themselves would last 60 s more


def test_a_worker_restarted_on_its_gpu_takes_its_batches_back_at_once_not_when_their_leases_end(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a run in progress on one GPU
    run = "restart-generate"
    ledger = a_run_under_way_on_one_gpu(stack, tmp_path, run)
    # When its worker is SIGKILLed and started again on the same GPU
    held_by_the_killed = set(ledger.client.hvals(ledger.keys.lease_owners))
    assert held_by_the_killed, "the kill came when no batch was leased"
    stack.generators[0].kill()
    before_kill = handed_over(ledger)
    killed_at = time.monotonic()
    stack.start_generator(0)
    # Then the batches the dead one held are taken back in seconds, far within their leases' 60 s
    wait_until(
        lambda: not held_by_the_killed & set(ledger.client.hvals(ledger.keys.lease_owners)),
        timeout_s=TAKEN_BACK_WITHIN_S,
        what="the restarted worker to take its predecessor's batches back",
    )
    assert time.monotonic() - killed_at < TAKEN_BACK_WITHIN_S
    stack.wait_finished(run, timeout_s=FINISH_AFTER_KILL_S)
    # And every prompt is committed once; none handed over before the kill was generated again
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout
    generations = ok_generations(stack.sims[0], run)
    assert {prompt_id: generations[prompt_id] for prompt_id in before_kill} == dict.fromkeys(before_kill, 1)


def test_a_second_worker_started_on_a_busy_gpu_is_refused_and_takes_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    first = stack.start_generator(0)
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(80, "twice")]
    )
    run = "one-per-gpu"
    stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--batch-size", "16")
    ledger = RunLedger(redis.Redis.from_url(stack.redis_url), run)
    wait_until(lambda: ledger.client.hlen(ledger.keys.lease_owners) > 0, timeout_s=60, what="a batch leased")
    seat = ledger.client.get(seat_key(f"{socket.gethostname()}/gpu0"))

    second = celery_worker("gen0-again", "generate", first.env, stack.log_dir).start()
    assert second.process is not None
    exit_code = second.process.wait(timeout=60)

    assert exit_code == EXIT_SEAT_HELD
    assert "another live worker holds" in second.log_text()
    assert first.alive()
    assert ledger.client.get(seat_key(f"{socket.gethostname()}/gpu0")) == seat
    holders = [decode_holder(raw) for raw in ledger.client.hvals(ledger.keys.lease_owners)]
    assert {holder.seat for holder in holders if holder is not None} <= {seat.decode() if seat else ""}
