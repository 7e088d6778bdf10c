"""Batch leases and reconciliation on a real redis-server: nothing waits for a message that never comes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis

from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from devstack.local_stack import free_port, start_redis
from producer.enqueue.enqueuer import Enqueuer
from tests.support.dispatch import RecordingDispatcher
from tests.support.records import completion, prompt
from workers.app import make_app
from workers.broker.kombu_layout import reserved_generate_batches, waiting_generate_batches, waiting_messages
from workers.recovery.leases import Acquired, LeaseKeeper, decode_holder
from workers.recovery.reconciler import Reconciler, ReconcileSettings
from workers.settings import WorkerSettings
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE, GENERATE_TASK, queue_lists
from workers.state.redis_client import redis_now_s

pytestmark = pytest.mark.integration

RUN = "leases"
NO_TIME_S = 0.0  # a lease or grace of zero has run out at once: the tests need not wait for a clock
LONG_S = 3600.0
RECEIVE_TIMEOUT_S = 5.0


def enqueue_batches(client: redis.Redis, count: int) -> list[str]:
    """Store `count` one-prompt batches as `enqueue` does; their messages are 'published' nowhere."""
    published: list[str] = []

    def publish(_run: str, batch_ids: Sequence[str]) -> None:
        published.extend(batch_ids)

    settings = RunSettings(run=RUN, sampling=SamplingSettings(), output="file:///tmp/x", batch_size=1)
    Enqueuer(client, settings, publish, source="test").enqueue(prompt(f"p{i}") for i in range(count))
    client.sadd("draftgen:runs", RUN)
    return published


def generate_envelope(run: str, batch_id: str) -> str:
    """A generate message as kombu 5.7 lays it in the queue (test_kombu_layout proves the real one)."""
    body = base64.b64encode(json.dumps([[run, batch_id], {}, {}]).encode()).decode()
    headers = {"task": GENERATE_TASK, "id": "task-id"}
    return json.dumps({"body": body, "headers": headers, "properties": {"body_encoding": "base64"}})


def reconciler(
    client: redis.Redis, dispatcher: RecordingDispatcher, *, grace_s: float = LONG_S
) -> Reconciler:
    return Reconciler(
        client, dispatcher, ReconcileSettings(upload_max_age_s=LONG_S, stranded_grace_s=grace_s)
    )


def test_a_second_delivery_of_a_leased_batch_is_sent_away_while_the_first_holds_it(
    redis_client: redis.Redis,
) -> None:
    (batch,) = enqueue_batches(redis_client, 1)
    first = LeaseKeeper(redis_client, worker="gpu0", ttl_s=LONG_S)
    second = LeaseKeeper(redis_client, worker="gpu1", ttl_s=LONG_S)
    assert first.acquire(RUN, batch)[0] is Acquired.ACQUIRED
    assert second.acquire(RUN, batch)[0] is Acquired.HELD


def test_a_lease_nobody_renews_is_taken_back_and_its_batch_dispatched_again(
    redis_client: redis.Redis,
) -> None:
    # Given a batch leased by a worker that then died (it renews nothing)
    (batch,) = enqueue_batches(redis_client, 1)
    LeaseKeeper(redis_client, worker="dead-gpu", ttl_s=NO_TIME_S).acquire(RUN, batch)
    dispatcher = RecordingDispatcher()
    # When the reconciler passes
    report = reconciler(redis_client, dispatcher).reconcile_all()
    # Then the batch is dispatched again, once, before every batch not begun, and a new delivery can lease it
    assert (report.expired_leases, dispatcher.generated) == (1, [(RUN, batch)])
    assert dispatcher.resumed == [(RUN, batch)]
    assert reconciler(redis_client, dispatcher).reconcile_all().expired_leases == 0
    assert LeaseKeeper(redis_client, worker="gpu1").acquire(RUN, batch)[0] is Acquired.ACQUIRED


def test_a_live_lease_is_never_taken_back_however_long_its_batch_runs(
    redis_client: redis.Redis,
) -> None:
    (batch,) = enqueue_batches(redis_client, 1)
    keeper = LeaseKeeper(redis_client, worker="gpu0", ttl_s=LONG_S)
    _, lease = keeper.acquire(RUN, batch)
    dispatcher = RecordingDispatcher()
    for _ in range(3):
        keeper.renew()
        reconciler(redis_client, dispatcher, grace_s=NO_TIME_S).reconcile_all()
    assert dispatcher.generated == []
    assert keeper.held(lease)


def test_a_holder_that_froze_past_its_lease_learns_another_took_over_and_stops_sending(
    redis_client: redis.Redis,
) -> None:
    # Given a worker whose lease ran out while it was stopped, and another worker that took the batch
    (batch,) = enqueue_batches(redis_client, 1)
    frozen = LeaseKeeper(redis_client, worker="gpu0", ttl_s=NO_TIME_S)
    _, old = frozen.acquire(RUN, batch)
    reconciler(redis_client, RecordingDispatcher()).reconcile_all()
    assert LeaseKeeper(redis_client, worker="gpu1", ttl_s=LONG_S).acquire(RUN, batch)[0] is (
        Acquired.ACQUIRED
    )
    # When the frozen worker wakes, it already sends nothing (its own clock says the lease ran out),
    # and its next renewal tells it the batch is another's
    assert not frozen.held(old)
    assert frozen.renew() == [old]
    assert not frozen.held(old)


def test_a_renewal_takes_back_a_lease_that_ran_out_when_nobody_else_took_it(
    redis_client: redis.Redis,
) -> None:
    (batch,) = enqueue_batches(redis_client, 1)
    keeper = LeaseKeeper(redis_client, worker="gpu0", ttl_s=NO_TIME_S)
    _, lease = keeper.acquire(RUN, batch)
    assert keeper.renew() == []
    holder = decode_holder(redis_client.hget(RunKeys(RUN).lease_owners, batch))
    assert holder is not None and holder.owner == lease.holder.owner


def test_a_batch_handed_back_while_redis_was_away_is_free_for_its_retry_once_redis_is_back(
    tmp_path: Path, log_dir: Path
) -> None:
    # Given a batch leased against a Redis of its own, which then goes away (a restart)
    port = free_port()
    server = start_redis(port, tmp_path / "data", log_dir)
    client = redis.Redis.from_url(server.url)
    try:
        (batch,) = enqueue_batches(client, 1)
        keeper = LeaseKeeper(client, worker="gpu0", ttl_s=LONG_S)
        _, lease = keeper.acquire(RUN, batch)
        server.stop()
        # When the worker hands it back while Redis is away, and Redis comes back
        keeper.release_soon(lease, delay_s=NO_TIME_S)
        server = start_redis(port, tmp_path / "data", log_dir / "restarted")
        keeper.renew()
        # Then the batch's retry can lease it at once, without waiting for the lease to run out
        assert LeaseKeeper(client, worker="gpu0").acquire(RUN, batch)[0] is Acquired.ACQUIRED
    finally:
        client.close()
        server.stop()


def test_a_batch_whose_message_was_lost_is_dispatched_again_and_one_still_queued_is_not(
    redis_client: redis.Redis,
) -> None:
    # Given two stored batches nobody leases: one's message waits in the queue, the other's was lost
    queued, lost = enqueue_batches(redis_client, 2)
    redis_client.lpush(GENERATE_QUEUE, generate_envelope(RUN, queued))
    dispatcher = RecordingDispatcher()
    # When the reconciler passes after the grace period
    report = reconciler(redis_client, dispatcher, grace_s=NO_TIME_S).reconcile_all()
    # Then only the lost one is dispatched again
    assert (report.stranded, dispatcher.generated) == (1, [(RUN, lost)])


def test_a_batch_within_its_grace_period_is_left_alone(
    redis_client: redis.Redis,
) -> None:
    enqueue_batches(redis_client, 1)
    dispatcher = RecordingDispatcher()
    assert reconciler(redis_client, dispatcher, grace_s=LONG_S).reconcile_all().stranded == 0
    assert dispatcher.generated == []


def test_staged_completions_get_a_flush_once_nothing_is_left_to_generate(
    redis_client: redis.Redis,
) -> None:
    # Given a run whose last batch finished, with a completion staged and no flush message coming
    (batch,) = enqueue_batches(redis_client, 1)
    RunLedger(redis_client, RUN).stage(completion("p0"))
    keeper = LeaseKeeper(redis_client, worker="gpu0")
    _, lease = keeper.acquire(RUN, batch)
    keeper.finish(lease, ["p0"])
    dispatcher = RecordingDispatcher()
    # When the reconciler passes, then it asks the uploader to flush the run
    assert reconciler(redis_client, dispatcher).reconcile_all().flushes == 1
    assert dispatcher.flushed == [RUN]


def test_staged_completions_younger_than_the_upload_age_wait_while_batches_remain(
    redis_client: redis.Redis,
) -> None:
    enqueue_batches(redis_client, 2)
    RunLedger(redis_client, RUN).stage(completion("p0"))
    dispatcher = RecordingDispatcher()
    assert reconciler(redis_client, dispatcher).reconcile_all().flushes == 0


def test_enqueue_re_run_requeues_the_batches_whose_messages_were_lost(redis_url: str, tmp_path: Path) -> None:
    # Given a run enqueued while no worker runs, whose queued messages are then lost
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"question {i}"}) + "\n" for i in range(8)))
    env = {**os.environ, "DRAFTGEN_REDIS_URL": redis_url}
    command = [sys.executable, "-m", "producer", "enqueue", str(data), "--run", "lost-messages"]
    command += ["--output", str(tmp_path / "out"), "--batch-size", "2"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    client = redis.Redis.from_url(redis_url)
    assert waiting_messages(client, GENERATE_QUEUE) == 4
    client.delete(*queue_lists(GENERATE_QUEUE))
    # When enqueue runs again with the same data
    again = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    # Then it adds nothing new, but every batch no message carried is queued again
    assert again.returncode == 0, again.stderr
    assert "requeued            4 batches" in again.stdout
    assert waiting_generate_batches(client, max_messages=100) == {
        ("lost-messages", raw.decode()) for raw in client.zrange(RunKeys("lost-messages").open_batches, 0, -1)
    }


def test_a_message_a_worker_has_taken_but_not_leased_yet_keeps_its_batch_from_an_enqueue_requeue(
    redis_url: str,
) -> None:
    # Given a run's two batches, each published; a worker has taken one message and not yet leased it
    client = redis.Redis.from_url(redis_url)
    taken, waiting = enqueue_batches(client, 2)
    app = make_app(WorkerSettings(redis_url=redis_url))
    for batch in (taken, waiting):
        app.send_task(GENERATE_TASK, args=[RUN, batch])
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(GENERATE_QUEUE)
        queue.get(block=True, timeout=RECEIVE_TIMEOUT_S)  # the first sent, `taken`
        assert reserved_generate_batches(client, RUN) == {taken}
        # When enqueue's own pass looks for batches no message carries
        dispatcher = RecordingDispatcher()
        report = reconciler(client, dispatcher, grace_s=NO_TIME_S).reconcile_run(
            RUN, dispatched_before_s=redis_now_s(client)
        )
        # Then neither is dispatched again: one is held by the worker, the other still queued
        assert report.stranded == 0 and dispatcher.generated == []
        queue.close()


def test_an_enqueue_requeues_the_stranded_batches_of_earlier_enqueues_and_none_of_its_own(
    redis_client: redis.Redis,
) -> None:
    # Given a batch an earlier enqueue stored whose message was lost, then this enqueue's batch,
    # published but not yet seen in the queue (as when a worker pops it while the pass reads)
    (earlier,) = enqueue_batches(redis_client, 1)
    started_s = redis_now_s(redis_client)
    (own,) = enqueue_batches(redis_client, 2)  # p0 is in the run already: one new batch, p1's
    dispatcher = RecordingDispatcher()
    # When this enqueue's pass looks for batches no message carries
    report = reconciler(redis_client, dispatcher, grace_s=NO_TIME_S).reconcile_run(
        RUN, dispatched_before_s=started_s
    )
    # Then only the earlier batch is dispatched again
    assert (report.stranded, dispatcher.generated) == (1, [(RUN, earlier)])
    assert own in {raw.decode() for raw in redis_client.zrange(RunKeys(RUN).open_batches, 0, -1)}
