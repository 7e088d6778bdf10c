"""Every record read back from Redis is bounded and checked before it is trusted: what a GPU node's Redis
user can write into the upload path (deploy/redis-users.acl lets it HSETNX the hand-over keys and call
`stage` with any id and any blob) is quarantined, never committed, and the rest of the run commits in the
same flush; a real prompt it held is generated again.

On the fleet's Redis as deployed (TLS, the ACL users): the producer's user enqueues, `verify`s and reads
`status`, the GPU node's user forges and generates (the real `handle_generate`, its server answering at
once: tests/support/instant_worker.py), the uploader's user flushes.
"""

from __future__ import annotations

import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import redis

from core.records import DeadLetter, Origin, Prompt, PromptBatch, SamplingSettings
from core.run_settings.model import RunSettings
from inference.server_facts import ServerFacts, facts_from_server_info, facts_id
from producer.enqueue.enqueuer import Enqueuer, pin_settings
from producer.status.figures import STATE_FINISHED
from producer.status.gather import gather_status
from producer.status.metrics import DraftgenCollector
from producer.upkeep.gc import collect_orphans
from producer.upkeep.verify import describe, verify_run
from tests.support.instant_worker import InstantWorker
from tests.support.records import completion, prompt, zstd_bomb
from tests.support.redis_head import GPU_NODES, RedisHead, node_user
from workers.errors import RecordTooLarge, RetryLater
from workers.record.manifest import QUARANTINE_PREFIX, SERVERS_PREFIX
from workers.record.object_store import ObjectStore
from workers.record.output_pin import write_run_json
from workers.record.parquet_io import read_completions
from workers.record.reading import read_committed
from workers.record.storage import open_store
from workers.record.upload_settings import UploadSettings
from workers.record.uploader import FlushReport, Uploader
from workers.state.codec import decode_blob, encode_blob
from workers.state.keys import SERVERS_KEY, RunKeys
from workers.state.ledger import RunLedger
from workers.state.record_limits import RECORD_LIMIT_BYTES, batch_body_limit_bytes
from workers.state.redis_client import redis_now_s

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

pytestmark = pytest.mark.integration

WORKER = node_user(GPU_NODES[0])
BOMB_INFLATES_TO_BYTES = 4 * RECORD_LIMIT_BYTES  # a few KB stored
# What a flush may hold while it refuses a bomb: the decompressor's output (the ceiling and a byte)
# and its growth, never what the bomb asks for.
FLUSH_PEAK_BYTES_MOST = 3 * RECORD_LIMIT_BYTES


@dataclass
class World:
    """One run on the deployed Redis, each process as its own user."""

    run: str
    settings: RunSettings
    producer: redis.Redis
    node: redis.Redis  # a GPU node's user: its workers, and whoever holds its password
    store: ObjectStore
    uploader: Uploader
    worker: InstantWorker

    @property
    def keys(self) -> RunKeys:
        return RunKeys(self.run)

    def enqueue(self, ids: list[str]) -> list[str]:
        published: list[str] = []
        Enqueuer(
            self.producer, self.settings, lambda _run, b: published.extend(b), source="t", store=self.store
        ).enqueue(prompt(prompt_id) for prompt_id in ids)
        return published

    def flush(self) -> FlushReport:
        return self.uploader.flush(self.run)

    def forge_staged(self, field: bytes | str, blob: bytes) -> None:
        """What the node's password can do without any function: a record under any field, indexed."""
        assert self.node.hsetnx(self.keys.staged, field, blob)
        self.node.zadd(self.keys.staged_index, {field: redis_now_s(self.node)})
        self.node.incrby(self.keys.staged_bytes, len(blob))

    def committed(self) -> dict[str, int]:
        record = read_committed(self.store)
        return dict(record.completed)


@pytest.fixture
def world(head: RedisHead, tmp_path: Path) -> Iterator[World]:
    run = f"quarantine-{uuid.uuid4().hex[:8]}"
    producer, node, upload = (
        redis.Redis.from_url(head.urls[user]) for user in ("producer", WORKER, "uploader")
    )
    store = open_store((tmp_path / "out").as_uri())
    settings = RunSettings(run=run, sampling=SamplingSettings(), output=store.url)
    pin_settings(producer, settings)
    write_run_json(store, settings)
    yield World(
        run=run,
        settings=settings,
        producer=producer,
        node=node,
        store=store,
        uploader=Uploader(upload, UploadSettings(), lambda _run: store),
        worker=InstantWorker(node, settings),
    )
    for client in (producer, node, upload):
        client.close()


def finish(world: World, report: FlushReport) -> FlushReport:
    """The flush task's part (workers/tasks.py): the batches it re-opened are generated, then flushed."""
    for batch_id in report.reopened_batches:
        world.worker.generate(batch_id)
    return world.flush()


def verified(world: World) -> list[str]:
    report = verify_run(world.store, world.run, world.producer)
    lines = describe(report)
    assert report.ok, lines
    return [f"{entry.kind} {entry.id} {entry.reason}" for entry in report.quarantined]


def test_an_undecodable_staged_record_is_quarantined_and_the_rest_of_the_run_commits_in_the_same_flush(
    world: World,
) -> None:
    (batch,) = world.enqueue(["p0", "p1", "p2", "p3"])
    world.forge_staged("p1", b"\x00 not a zstd frame")  # before p1 is generated: its worker skips it
    world.worker.generate(batch)

    report = world.flush()

    assert world.committed() == {"p0": 1, "p2": 1, "p3": 1}
    assert (report.parts, report.completions, report.quarantined) == (1, 3, 1)
    assert report.reopened_batches == [batch]  # p1 is the run's: its batch is open again
    finish(world, report)
    assert world.committed() == {"p0": 1, "p1": 1, "p2": 1, "p3": 1}
    assert verified(world) == ["staged p1 unreadable"]
    assert gather_status(world.producer, world.run).state == STATE_FINISHED


def test_decompression_bombs_are_refused_at_the_record_limit_and_quarantined(world: World) -> None:
    (batch,) = world.enqueue(["p0", "p1", "p2", "p3"])
    bomb = zstd_bomb("p1", inflates_to_bytes=BOMB_INFLATES_TO_BYTES)
    for field in ("p1", "p2", "p3"):
        world.forge_staged(field, bomb)
    world.worker.generate(batch)

    tracemalloc.start()
    try:
        report = world.flush()
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert world.committed() == {"p0": 1}
    assert len(bomb) < BOMB_INFLATES_TO_BYTES // 1000
    assert peak < FLUSH_PEAK_BYTES_MOST, f"the flush held {peak:,} bytes"
    assert (report.completions, report.quarantined) == (1, 3)
    finish(world, report)
    assert world.committed() == {"p0": 1, "p1": 1, "p2": 1, "p3": 1}
    assert verified(world) == [f"staged {field} over_limit" for field in ("p1", "p2", "p3")]


def test_a_record_under_one_prompt_holding_another_s_completion_commits_each_once_and_regenerates_the_first(
    world: World,
) -> None:
    (batch,) = world.enqueue(["p0", "p1", "p2"])
    world.forge_staged("p1", encode_blob(completion("p2", content="\n\nforged")))
    world.worker.generate(batch)  # p1 looks handed over: only p0 and p2 are generated
    assert world.worker.engine.answered == ["p0", "p2"]

    report = world.flush()

    assert world.committed() == {"p0": 1, "p2": 1}  # p1 is not marked done with p2's row
    report = finish(world, report)
    assert world.committed() == {"p0": 1, "p1": 1, "p2": 1}
    assert world.worker.engine.answered == ["p0", "p2", "p1"]
    rows = {
        row.prompt_id: row
        for key in world.store.list("data/")
        for row in read_completions(world.store.get(key.key))
    }
    assert rows["p1"].messages[0].content == "question p1" and rows["p2"].content != "\n\nforged"
    assert report.completions == 1
    assert verified(world) == ["staged p1 prompt_id_mismatch"]


def test_an_id_the_run_never_accepted_is_never_committed_and_status_never_says_over_a_hundred_percent(
    world: World,
) -> None:
    (batch,) = world.enqueue(["p0", "p1"])
    assert RunLedger(world.node, world.run).stage(completion("intruder"))  # the `stage` function, any id
    world.worker.generate(batch)

    report = world.flush()

    assert world.committed() == {"p0": 1, "p1": 1}
    assert (report.completions, report.quarantined, report.reopened_batches) == (2, 1, [])
    status = gather_status(world.producer, world.run)
    assert (status.progress.committed, status.progress.enqueued, status.state) == (2, 2, STATE_FINISHED)
    assert status.quarantine is not None and status.quarantine.reasons == {"not_accepted": 1}
    assert any("1 records quarantined (not_accepted 1)" in warning for warning in status.warnings)
    exported = {
        (sample.name, sample.labels.get("reason", "")): sample.value
        for family in DraftgenCollector(world.producer, lambda: [world.run]).collect()
        for sample in family.samples
        if "quarantined" in sample.name
    }
    assert exported == {
        ("draftgen_records_quarantined", ""): 1,
        ("draftgen_records_quarantined_by_reason", "not_accepted"): 1,
    }
    assert verified(world) == ["staged intruder not_accepted"]
    assert [entry.id for entry in verify_run(world.store, world.run).quarantined] == ["intruder"]  # no Redis
    kept = [info.key for info in world.store.list(QUARANTINE_PREFIX)]
    collect_orphans(world.store)
    assert kept and [info.key for info in world.store.list(QUARANTINE_PREFIX)] == kept  # gc leaves them


def test_a_record_under_a_field_that_is_no_text_is_quarantined_not_a_wedge(world: World) -> None:
    (batch,) = world.enqueue(["p0"])
    world.forge_staged(b"\xff\xfe", encode_blob(completion("p0")))
    world.worker.generate(batch)

    report = world.flush()

    assert world.committed() == {"p0": 1} and report.quarantined == 1
    assert world.producer.zcard(world.keys.staged_index) == 0
    assert verified(world) == ["staged \\xff\\xfe unreadable"]


def test_a_pending_dead_letter_under_the_wrong_prompt_is_quarantined_and_that_prompt_generated(
    world: World,
) -> None:
    (batch,) = world.enqueue(["p0", "p1"])
    letter = DeadLetter(prompt_id="p0", row=1, reason="failed_every_attempt", error="HTTP 500", attempts=3)
    assert world.node.hsetnx(world.keys.dead, "p1", msgspec.json.encode(letter))
    world.node.zadd(world.keys.dead_pending, {"p1": redis_now_s(world.node)})
    world.worker.generate(batch)

    report = world.flush()

    assert read_committed(world.store).dead == {} and world.committed() == {"p0": 1}
    finish(world, report)
    assert world.committed() == {"p0": 1, "p1": 1}
    assert verified(world) == ["dead_letter p1 prompt_id_mismatch"]


def test_a_prompt_quarantined_while_its_batch_is_open_is_handed_back_and_generated_again(
    world: World,
) -> None:
    (batch,) = world.enqueue(["p0", "p1"])
    world.forge_staged("p1", encode_blob(completion("p0")))
    world.worker.engine.between = world.flush  # the uploader quarantines p1 before the batch settles

    with pytest.raises(RetryLater, match="no hand-over of 1 prompts"):
        world.worker.generate(batch)
    world.worker.engine.between = lambda: None
    world.worker.generate(batch)
    world.flush()

    assert world.committed() == {"p0": 1, "p1": 1}
    assert verified(world) == ["staged p1 prompt_id_mismatch"]


def test_a_batch_whose_body_cannot_be_read_is_quarantined_and_an_enqueue_re_run_batches_its_prompts_again(
    world: World, head: RedisHead
) -> None:
    (batch,) = world.enqueue(["p0", "p1"])
    admin = redis.Redis.from_url(head.urls["admin"])
    admin.set(world.keys.batch(batch), b"corrupt")  # no user of a process may: a disk, a bug

    report = world.worker.generate(batch)

    assert "quarantined" in report.note and world.producer.zcard(world.keys.open_batches) == 0
    status = gather_status(world.producer, world.run)
    assert any("re-run `enqueue`" in warning for warning in status.warnings), status.warnings
    (again,) = world.enqueue(["p0", "p1"])
    world.worker.generate(again)
    world.flush()
    assert world.committed() == {"p0": 1, "p1": 1}
    assert verified(world) == ["batch " + batch + " unreadable"]


def test_a_finished_batch_re_opened_while_an_enqueue_re_runs_keeps_its_prompts_in_it_alone(
    world: World, head: RedisHead
) -> None:
    # Given a batch generated and finished (its body kept), one of its staged records broken since, and no
    # batch open: an enqueue re-run then judges whether prompts the run holds lost their batches
    (batch,) = world.enqueue(["p0", "p1"])
    world.worker.generate(batch)
    admin = redis.Redis.from_url(head.urls["admin"])
    admin.hset(world.keys.staged, "p1", b"\x00 not a zstd frame")  # a disk, a bug
    reopened: list[str] = []
    published: list[str] = []

    def rows_read_while_a_flush_reopens_the_batch() -> Iterator[Prompt]:
        reopened.extend(world.flush().reopened_batches)  # after the re-run opened, before it claims
        yield from (prompt(prompt_id) for prompt_id in ("p0", "p1"))

    # When the re-run reads its rows while a flush quarantines p1's record and opens its batch again
    report = Enqueuer(
        world.producer, world.settings, lambda _run, b: published.extend(b), source="t", store=world.store
    ).enqueue(rows_read_while_a_flush_reopens_the_batch())

    # Then p1 stays in its own batch alone, generated again there, and committed once
    assert (reopened, published, report.requeued_orphans, report.already_there) == ([batch], [], 0, 2)
    world.worker.generate(batch)
    world.flush()
    assert world.committed() == {"p0": 1, "p1": 1}


def test_finished_bodies_are_kept_until_their_prompts_are_committed_then_forgotten(world: World) -> None:
    (batch,) = world.enqueue(["p0", "p1"])
    world.worker.generate(batch)
    kept = world.producer.get(world.keys.finished_batch(batch))
    assert kept is not None and not world.producer.exists(world.keys.batch(batch))
    body = decode_blob(kept, PromptBatch, limit_bytes=batch_body_limit_bytes(world.settings.batch_size))
    assert [one.id for one in body.prompts] == ["p0", "p1"]

    report = world.flush()

    assert report.finished_bodies_forgotten == 1
    for key in (world.keys.finished_batch(batch), world.keys.finished_batches, world.keys.finished_prompts):
        assert not world.producer.exists(key)


def test_kept_turns_that_cannot_be_read_are_dropped_and_the_conversation_starts_over(world: World) -> None:
    world.enqueue(["p0"])
    world.node.hset(world.keys.turns, "p0", zstd.compress(b"[" * 1000))

    assert RunLedger(world.node, world.run).kept_turns(["p0"]) == {}
    assert not world.producer.hexists(world.keys.turns, "p0")


def facts_of(model: str) -> ServerFacts:
    return facts_from_server_info({"model_path": model}, "http://instant")


@pytest.mark.parametrize(
    "facts",
    [b"{not json", msgspec.json.encode(facts_of("another-model"))],
    ids=["unreadable", "not-what-its-id-names"],
)
def test_server_facts_that_cannot_be_trusted_are_not_written_to_the_output(
    world: World, facts: bytes
) -> None:
    identity = facts_id(facts_of(f"the-model-of-{world.run}"))
    assert world.node.hsetnx(SERVERS_KEY, identity, facts)
    (batch,) = world.enqueue(["p0"])
    origin = Origin(host="node-a", gpu=0, server_url="http://instant", server=identity)
    assert RunLedger(world.node, world.run).stage(msgspec.structs.replace(completion("p0"), origin=origin))
    world.worker.generate(batch)

    world.flush()

    assert world.committed() == {"p0": 1}
    assert list(world.store.list(SERVERS_PREFIX)) == []


def test_a_completion_past_the_record_limit_is_refused_at_the_hand_over(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.enqueue(["p0"])
    monkeypatch.setattr("workers.state.ledger.RECORD_LIMIT_BYTES", 100)

    with pytest.raises(RecordTooLarge, match="past the record limit of 100"):
        RunLedger(world.node, world.run).stage(completion("p0"))
    assert not world.producer.hexists(world.keys.staged, "p0")
