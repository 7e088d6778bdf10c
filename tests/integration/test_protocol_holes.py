"""Holes a reading of the protocol found, each reproduced step by step on a real redis-server.

Each test drives the real scripts and the real Python steps through the exact sequence that once lost,
stranded or duplicated a prompt: no crash needed for some, a Redis that lost its last second of writes
(tests/support/redis_snapshot.py) for others, and two processes interleaved at one precise call.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import redis

from core.records import DeadLetter, PromptBatch, SamplingSettings
from core.run_settings.model import RunSettings
from producer.enqueue.enqueuer import Enqueuer, pin_settings
from producer.errors import EnqueueBusy
from producer.upkeep.gc import collect_orphans
from producer.upkeep.verify import verify_run
from tests.support.dispatch import RecordingDispatcher
from tests.support.records import completion, prompt
from tests.support.redis_snapshot import RedisSnapshot
from workers.context import WorkerContext
from workers.errors import StoreUnavailable
from workers.generate import batches
from workers.generate.generation import BatchOutcome
from workers.record.manifest import DATA_PREFIX, DEAD_PREFIX, MANIFEST_PREFIX, data_key
from workers.record.object_store import ObjectInfo, ObjectStore
from workers.record.output_pin import write_run_json
from workers.record.reading import read_committed
from workers.record.storage import FolderStore, open_store
from workers.record.upload_settings import UploadSettings
from workers.record.uploader import Uploader
from workers.recovery.leases import Acquired, LeaseKeeper
from workers.recovery.reconciler import Reconciler, ReconcileSettings
from workers.settings import WorkerSettings
from workers.state.codec import decode_blob
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.record_limits import RECORD_LIMIT_BYTES

pytestmark = pytest.mark.integration

RUN = "holes"
LONG_S = 3600.0


@pytest.fixture
def output(tmp_path: Path) -> ObjectStore:
    return open_store((tmp_path / "out").as_uri())


def start_run(client: redis.Redis, store: ObjectStore, *, batch_size: int = 32) -> RunSettings:
    settings = RunSettings(run=RUN, sampling=SamplingSettings(), output=store.url, batch_size=batch_size)
    pin_settings(client, settings)
    write_run_json(store, settings)
    return settings


def enqueue(client: redis.Redis, settings: RunSettings, store: ObjectStore, ids: list[str]) -> list[str]:
    published: list[str] = []
    Enqueuer(
        client, settings, lambda _run, batch_ids: published.extend(batch_ids), source="t", store=store
    ).enqueue(prompt(prompt_id) for prompt_id in ids)
    return published


def stored_batch(client: redis.Redis, batch_id: str) -> PromptBatch:
    blob = client.get(RunKeys(RUN).batch(batch_id))
    assert blob is not None
    return decode_blob(blob, PromptBatch, limit_bytes=RECORD_LIMIT_BYTES)


def letter(prompt_id: str) -> DeadLetter:
    return DeadLetter(prompt_id=prompt_id, row=1, reason="failed_every_attempt", error="HTTP 500", attempts=3)


def uploader(client: redis.Redis, store: ObjectStore) -> Uploader:
    return Uploader(client, UploadSettings(), lambda _run: store)


@pytest.fixture
def worker(redis_url: str) -> Iterator[tuple[WorkerContext, RecordingDispatcher]]:
    context = WorkerContext(WorkerSettings(redis_url=redis_url))
    dispatcher = RecordingDispatcher()
    context.dispatcher = dispatcher
    yield context, dispatcher
    context.close()


def outcome_future(
    outcome: BatchOutcome | None = None, error: Exception | None = None
) -> Future[BatchOutcome]:
    done: Future[BatchOutcome] = Future()
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(outcome or BatchOutcome())
    return done


# --- 1. dead letters nothing flushes


def test_dead_letters_left_when_nothing_else_remains_get_a_flush_from_the_reconciler(
    redis_client: redis.Redis, output: ObjectStore
) -> None:
    settings = start_run(redis_client, output)
    (batch_id,) = enqueue(redis_client, settings, output, ["p0"])
    RunLedger(redis_client, RUN).dead_letter(letter("p0"))
    keeper = LeaseKeeper(redis_client, worker="w")
    assert keeper.finish(keeper.acquire(RUN, batch_id)[1], ["p0"]) == []
    dispatcher = RecordingDispatcher()

    Reconciler(redis_client, dispatcher, ReconcileSettings(upload_max_age_s=LONG_S)).reconcile_all()

    assert dispatcher.flushed == [RUN]


def test_a_batch_tail_that_gives_up_on_its_last_failure_asks_for_a_flush_of_its_dead_letters(
    redis_client: redis.Redis, output: ObjectStore, worker: tuple[WorkerContext, RecordingDispatcher]
) -> None:
    context, dispatcher = worker
    settings = start_run(redis_client, output)
    (batch_id,) = enqueue(redis_client, settings, output, ["p0", "p1"])
    keys = RunKeys(RUN)
    redis_client.hset(keys.batch_failures, batch_id, batches.MAX_BATCH_FAILURES - 1)
    _, lease = context.leases.acquire(RUN, batch_id)

    batches._settle_tail(
        context, lease, stored_batch(redis_client, batch_id), 2, outcome_future(error=RuntimeError("boom"))
    )

    assert RunLedger(redis_client, RUN).counts().dead_pending == 2
    assert dispatcher.flushed == [RUN]


# --- 2. a batch finished on the worker's word


def test_a_batch_whose_hand_over_redis_lost_is_not_finished_but_dispatched_again(
    redis_client: redis.Redis, output: ObjectStore, worker: tuple[WorkerContext, RecordingDispatcher]
) -> None:
    context, dispatcher = worker
    settings = start_run(redis_client, output)
    (batch_id,) = enqueue(redis_client, settings, output, ["p0", "p1"])
    _, lease = context.leases.acquire(RUN, batch_id)
    before_the_hand_over = RedisSnapshot.take(redis_client)
    ledger = RunLedger(redis_client, RUN)
    assert ledger.stage(completion("p0")) and ledger.stage(completion("p1"))
    before_the_hand_over.restore(redis_client)  # the last second of writes is gone

    batches._settle_tail(
        context, lease, stored_batch(redis_client, batch_id), 2, outcome_future(BatchOutcome(staged=2))
    )

    assert ledger.counts().remaining == 2
    assert redis_client.exists(RunKeys(RUN).batch(batch_id))
    assert dispatcher.generated == [(RUN, batch_id)]


# --- 3. adoption after the same rollback


def committed_occurrences(store: ObjectStore) -> tuple[list[str], list[str]]:
    record = read_committed(store)
    return sorted(record.completed.elements()), sorted(record.dead_occurrences.elements())


def test_a_dead_letter_committed_before_redis_lost_it_is_not_committed_again_as_a_completion(
    redis_client: redis.Redis, output: ObjectStore
) -> None:
    settings = start_run(redis_client, output)
    enqueue(redis_client, settings, output, ["p0"])
    ledger = RunLedger(redis_client, RUN)
    before_the_dead_letter = RedisSnapshot.take(redis_client)
    ledger.dead_letter(letter("p0"))
    uploader(redis_client, output).flush(RUN)
    before_the_dead_letter.restore(redis_client)
    ledger.stage(completion("p0"))  # generated again, and this time it worked

    uploader(redis_client, output).flush(RUN)
    uploader(redis_client, output).flush(RUN)

    assert committed_occurrences(output) == ([], ["p0"])
    assert verify_run(output, RUN, redis_client).ok


def test_a_completion_committed_before_redis_lost_it_is_not_committed_again_as_a_dead_letter(
    redis_client: redis.Redis, output: ObjectStore
) -> None:
    settings = start_run(redis_client, output)
    enqueue(redis_client, settings, output, ["p0"])
    ledger = RunLedger(redis_client, RUN)
    before_the_hand_over = RedisSnapshot.take(redis_client)
    ledger.stage(completion("p0"))
    uploader(redis_client, output).flush(RUN)
    before_the_hand_over.restore(redis_client)
    ledger.dead_letter(letter("p0"))  # generated again, and this time it failed

    uploader(redis_client, output).flush(RUN)
    uploader(redis_client, output).flush(RUN)

    assert committed_occurrences(output) == (["p0"], [])
    assert verify_run(output, RUN, redis_client).ok


# --- 4. two enqueues, one prompt


class StallingStore(FolderStore):
    """A folder whose first write of `enqueued/` stalls while `during_stall` runs (another enqueue)."""

    def __init__(self, root: Path, during_stall: Any) -> None:
        super().__init__(root)
        self._during_stall = during_stall

    def put(self, key: str, data: bytes) -> None:
        stall, self._during_stall = self._during_stall, None
        if stall is not None and key.startswith("enqueued/"):
            stall()
        super().put(key, data)


def test_an_enqueue_whose_lock_ran_out_while_it_stalled_claims_nothing_another_took_over(
    redis_client: redis.Redis, output: ObjectStore, tmp_path: Path
) -> None:
    settings = start_run(redis_client, output, batch_size=2)
    ids = ["p0", "p1", "p2", "p3"]
    second: list[str] = []

    def lock_runs_out_and_another_enqueue_runs() -> None:
        redis_client.delete(RunKeys(RUN).enqueue_lock)
        second.extend(enqueue(redis_client, settings, output, ids))

    stalling = StallingStore(tmp_path / "out", lock_runs_out_and_another_enqueue_runs)
    first = Enqueuer(redis_client, settings, lambda _run, _ids: None, source="first", store=stalling)

    with pytest.raises(EnqueueBusy):
        first.enqueue(prompt(prompt_id) for prompt_id in ids)

    batch_ids = [raw.decode() for raw in redis_client.zrange(RunKeys(RUN).open_batches, 0, -1)]
    placed = sorted(p.id for batch_id in batch_ids for p in stored_batch(redis_client, batch_id).prompts)
    assert placed == ids
    assert sorted(batch_ids) == sorted(second)


def test_an_enqueue_whose_lock_ran_out_before_its_first_chunk_does_not_take_it_again_and_batch_twice(
    redis_client: redis.Redis, output: ObjectStore
) -> None:
    """Found by the explorer (seed 2124839905): an enqueue judged the run to have no open batch (so a
    prompt the run holds that no batch carries is an orphan to batch again), stalled past its lock while
    another enqueue batched every prompt and released the lock, then took the free lock again and batched
    them all a second time as orphans."""
    settings = start_run(redis_client, output, batch_size=2)
    ids = ["p0", "p1", "p2", "p3"]
    second: list[str] = []

    def rows_read_after_the_lock_ran_out_and_another_enqueue_ran() -> Iterator[Any]:
        redis_client.delete(RunKeys(RUN).enqueue_lock)
        second.extend(enqueue(redis_client, settings, output, ids))
        yield from (prompt(prompt_id) for prompt_id in ids)

    first = Enqueuer(redis_client, settings, lambda _run, _ids: None, source="first", store=output)

    with pytest.raises(EnqueueBusy):
        first.enqueue(rows_read_after_the_lock_ran_out_and_another_enqueue_ran())

    batch_ids = [raw.decode() for raw in redis_client.zrange(RunKeys(RUN).open_batches, 0, -1)]
    placed = sorted(p.id for batch_id in batch_ids for p in stored_batch(redis_client, batch_id).prompts)
    assert placed == ids
    assert sorted(batch_ids) == sorted(second)


# --- 5. a renewal racing a hand-back


def test_a_renewal_racing_a_hand_back_does_not_take_the_lease_again(
    redis_client: redis.Redis, output: ObjectStore
) -> None:
    settings = start_run(redis_client, output)
    (batch_id,) = enqueue(redis_client, settings, output, ["p0"])
    keeper = LeaseKeeper(redis_client, worker="w")
    _, lease = keeper.acquire(RUN, batch_id)
    renew = keeper._scripts.renew_leases

    def hand_back_lands_between_the_list_and_the_renewal(*args: Any, **kwargs: Any) -> Any:
        keeper.release(lease, delay_s=0.0)
        return renew(*args, **kwargs)

    keeper._scripts = dataclasses.replace(
        keeper._scripts,
        renew_leases=hand_back_lands_between_the_list_and_the_renewal,  # type: ignore[arg-type]  # a function in the script's place
    )

    keeper.renew()

    assert LeaseKeeper(redis_client, worker="other").acquire(RUN, batch_id)[0] is Acquired.ACQUIRED


# --- 7. gc against a late flush


class ManifestOnce(FolderStore):
    """A folder whose first manifest entry cannot be written: the flush dies after its data object."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.refused = False

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if key.startswith(MANIFEST_PREFIX) and not self.refused:
            self.refused = True
            raise StoreUnavailable("the store went away before the manifest entry", delay_s=0.0)
        return super().put_if_absent(key, data)


class ListedEarlier(FolderStore):
    """gc's view of a folder: its listings as they were at one instant, its deletes as they are now."""

    def __init__(self, root: Path, listed: dict[str, list[ObjectInfo]]) -> None:
        super().__init__(root)
        self._listed = listed

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return iter(self._listed[prefix])


def test_gc_never_removes_an_object_that_a_flush_retried_an_hour_later_commits_meanwhile(
    redis_client: redis.Redis, output: ObjectStore, tmp_path: Path
) -> None:
    settings = start_run(redis_client, output)
    enqueue(redis_client, settings, output, ["p0"])
    RunLedger(redis_client, RUN).stage(completion("p0"))
    root = tmp_path / "out"
    with pytest.raises(StoreUnavailable):
        uploader(redis_client, ManifestOnce(root)).flush(RUN)
    (written,) = output.list(DATA_PREFIX)
    two_hours_ago = written.modified_at - 2 * LONG_S
    os.utime(root / written.key, (two_hours_ago, two_hours_ago))
    gc_listed = {prefix: list(output.list(prefix)) for prefix in (MANIFEST_PREFIX, DATA_PREFIX, DEAD_PREFIX)}

    uploader(redis_client, output).flush(RUN)  # the retry writes the same object again and commits it
    collect_orphans(ListedEarlier(root, gc_listed))

    assert verify_run(output, RUN, redis_client).ok


def test_gc_removes_the_objects_of_a_committed_part_its_manifest_entry_does_not_name(
    redis_client: redis.Redis, output: ObjectStore
) -> None:
    settings = start_run(redis_client, output)
    enqueue(redis_client, settings, output, ["p0"])
    RunLedger(redis_client, RUN).stage(completion("p0"))
    output.put(data_key(0, "0" * 64), b"a flush that died before its entry")
    output.put(data_key(1, "1" * 64), b"a flush of the next part, perhaps still at work")

    uploader(redis_client, output).flush(RUN)
    report = collect_orphans(output)

    assert report.removed == [data_key(0, "0" * 64)]
    assert report.kept_uncommitted == [data_key(1, "1" * 64)]
    assert verify_run(output, RUN, redis_client).ok
