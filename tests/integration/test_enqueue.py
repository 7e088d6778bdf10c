"""Enqueueing against a real Redis: only what is new, counted, and never lost between store and publish."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from core.records import PromptBatch, SamplingSettings, Turns, Usage
from core.run_settings.model import RunSettings
from devstack.local_stack import wait_until
from intake.reading import iter_prompts
from producer.enqueue.enqueuer import BATCHES_PER_CHUNK, Enqueuer, EnqueueReport, pin_settings
from producer.enqueue.publisher import BatchPublisher
from producer.enqueue.work_order import MIN_TURNS_LEARNED
from producer.errors import EnqueueBusy, RunStateBroken, SettingsError
from producer.run_access import pinned_settings
from producer.status.metrics import DraftgenCollector
from producer.upkeep.recover import recover_run
from tests.support import kombu_calls
from tests.support.records import completion
from workers.broker.broker import BrokerOptions, sending_app
from workers.broker.broker_transport import TRANSPORT_PATH
from workers.record.object_store import ObjectStore
from workers.record.output_pin import write_run_json
from workers.record.reading import read_enqueued_ids
from workers.record.storage import open_store
from workers.record.upload_settings import UploadSettings
from workers.record.uploader import Uploader
from workers.state.batch_priority import batch_priority
from workers.state.codec import decode_blob
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE
from workers.state.record_limits import RECORD_LIMIT_BYTES

pytestmark = pytest.mark.integration
RUN = "enqueue-test"
WAIT_S = 10.0


class RecordingPublisher:
    def __init__(self, fail_after: int | None = None) -> None:
        self.published: list[str] = []
        self.fail_after = fail_after

    def __call__(self, run: str, batch_ids: Sequence[str]) -> None:
        for batch_id in batch_ids:
            if self.fail_after is not None and len(self.published) >= self.fail_after:
                raise ConnectionError("broker went away")
            self.published.append(batch_id)


def settings(batch_size: int = 4, **sampling: Any) -> RunSettings:
    return RunSettings(
        run=RUN, sampling=SamplingSettings(**sampling), output="file:///tmp/out", batch_size=batch_size
    )


def write_jsonl(path: Path, rows: list[object]) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def rows(count: int, start: int = 0) -> list[object]:
    return [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(start, start + count)]


def prompts_in_batches(client: redis.Redis, batch_ids: list[str]) -> list[str]:
    keys = RunKeys(RUN)
    return [
        p.id
        for b in batch_ids
        for p in decode_blob(client.get(keys.batch(b)), PromptBatch, limit_bytes=RECORD_LIMIT_BYTES).prompts
    ]


def test_every_prompt_lands_in_exactly_one_published_batch(redis_client: redis.Redis, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", rows(10))
    publisher = RecordingPublisher()
    report = Enqueuer(redis_client, pin_settings(redis_client, settings()), publisher, source=data).enqueue(
        iter_prompts(data)
    )
    assert (report.new, report.batches) == (10, 3)
    assert sorted(prompts_in_batches(redis_client, publisher.published)) == sorted(f"q{i}" for i in range(10))


def test_the_longest_known_work_is_delivered_first_though_its_rows_come_last(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given two chunks of short questions, then rows whose dataset answers are long
    chunk_rows = BATCHES_PER_CHUNK * 4
    long_answer = "word " * 20_000
    long_rows = [
        {
            "id": f"long{i}",
            "messages": [
                {"role": "user", "content": f"essay {i}"},
                {"role": "assistant", "content": long_answer},
            ],
        }
        for i in range(8)
    ]
    data = write_jsonl(tmp_path / "d.jsonl", [*rows(2 * chunk_rows), *long_rows])
    publisher = BatchPublisher(
        sending_app(BrokerOptions(redis_url, visibility_timeout_s=7200, unacked_restore_interval_s=10))
    )
    Enqueuer(redis_client, pin_settings(redis_client, settings()), publisher, source=data).enqueue(
        iter_prompts(data)
    )
    publisher.close()
    # When a worker's channel takes the run's messages one by one
    with kombu_calls.connect(redis_url, transport=TRANSPORT_PATH) as connection:
        queue = kombu_calls.queue(GENERATE_QUEUE, channel=kombu_calls.open_channel(connection))
        delivered: list[str] = []
        while (message := kombu_calls.get(queue, no_ack=True)) is not None:
            delivered.append(message.payload[0][1])
    # Then the long work comes first, the rest after it, each batch once
    assert len(delivered) == len(set(delivered)) == 2 * BATCHES_PER_CHUNK + 2
    assert set(prompts_in_batches(redis_client, delivered[:2])) == {f"long{i}" for i in range(8)}


def test_what_a_later_enqueue_adds_is_ordered_by_the_turn_length_the_runs_completions_show(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a run whose completions so far show a turn takes 9,000 tokens (a thinking model), staged as a
    # generate worker stages them
    pinned = pin_settings(redis_client, settings(batch_size=2))
    ledger = RunLedger(redis_client, RUN)
    for i in range(MIN_TURNS_LEARNED):
        finished = completion(f"done{i}")
        ledger.stage(
            msgspec.structs.replace(
                finished, usage=Usage(prompt_tokens=5, completion_tokens=9_000, reasoning_tokens=8_000)
            )
        )
    # When rows come in: a 2-turn conversation the dataset leaves unanswered, a question whose dataset
    # answer is 4,000 tokens long
    conversation = {"id": "two", "messages": [user("first?"), assistant("ok"), user("second?")]}
    answered = {"id": "one", "messages": [user("essay?"), assistant("w" * 16_000)]}
    data = write_jsonl(tmp_path / "d.jsonl", [answered, conversation])
    publisher = RecordingPublisher()
    Enqueuer(redis_client, pinned, publisher, source=data).enqueue(iter_prompts(data, turns=Turns.ALL))
    # Then two of the run's turns go before one with a long answer (with no completions the guess of a
    # turn, 2,048 tokens, would put the answer first)
    classes = {prompts_in_batches(redis_client, [b])[0]: batch_priority(b) for b in publisher.published}
    assert classes["two"] < classes["one"]


def user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


def test_re_running_adds_only_what_is_new(redis_client: redis.Redis, tmp_path: Path) -> None:
    pinned = pin_settings(redis_client, settings())
    first = write_jsonl(tmp_path / "a.jsonl", rows(6))
    Enqueuer(redis_client, pinned, RecordingPublisher(), source=first).enqueue(iter_prompts(first))
    grown = write_jsonl(tmp_path / "b.jsonl", rows(9))
    publisher = RecordingPublisher()
    report = Enqueuer(redis_client, pinned, publisher, source=grown).enqueue(iter_prompts(grown))
    assert (report.new, report.already_there) == (3, 6)
    assert sorted(prompts_in_batches(redis_client, publisher.published)) == ["q6", "q7", "q8"]


def test_duplicate_ids_in_the_input_are_counted_and_enqueued_once(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [*rows(3), *rows(2), {"id": "q0", "prompt": "other"}])
    publisher = RecordingPublisher()
    report = Enqueuer(
        redis_client, pin_settings(redis_client, settings(batch_size=1)), publisher, source=data
    ).enqueue(iter_prompts(data))
    assert (report.new, report.duplicates_in_input, report.already_there) == (3, 2, 0)
    # the same id with other content is a conflict, not a duplicate: the first version is kept
    assert report.conflict_count == 1
    assert "conflicts with row 1 of this input" in report.conflicts[0].reason


def test_a_conflict_in_a_folder_names_the_file_and_row_of_both_versions(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", rows(2))
    write_jsonl(folder / "b.jsonl", [*rows(1, start=5), {"id": "q1", "prompt": "another question"}])
    report = Enqueuer(
        redis_client, pin_settings(redis_client, settings()), RecordingPublisher(), source=str(folder)
    ).enqueue(iter_prompts(str(folder)))

    (conflict,) = report.conflicts
    assert (conflict.file, conflict.row) == ("b.jsonl", 2)
    assert conflict.describe().startswith("b.jsonl:2: id 'q1' conflicts with a.jsonl:2 of this input")


def test_a_conflict_with_an_earlier_enqueue_of_a_folder_names_the_file_it_came_from(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    pinned = pin_settings(redis_client, settings())
    folder = tmp_path / "shards"
    folder.mkdir()
    shard = "train-00000-of-00042.jsonl"
    write_jsonl(folder / shard, rows(3))
    Enqueuer(redis_client, pinned, RecordingPublisher(), source=str(folder)).enqueue(
        iter_prompts(str(folder))
    )
    changed = write_jsonl(tmp_path / "changed.jsonl", [{"id": "q2", "prompt": "edited"}])

    report = Enqueuer(redis_client, pinned, RecordingPublisher(), source=changed).enqueue(
        iter_prompts(changed)
    )

    (conflict,) = report.conflicts
    assert f"conflicts with {shard}:3 of enqueue 1 (" in conflict.reason
    # Redis holds the file by a number the run gave it: a long shard name is not paid for on every id
    assert all(shard.encode() not in holder for holder in redis_client.hvals(RunKeys(RUN).ids("q2")))


def test_bad_rows_are_reported_by_row_number_and_the_rest_enqueued(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = write_jsonl(
        tmp_path / "d.jsonl",
        [
            rows(1)[0],
            "{broken json",
            {"id": "x"},
            {"id": "y", "prompt": ""},
            {"id": "z", "messages": "hi"},
            *rows(1, 1),
        ],
    )
    report = Enqueuer(
        redis_client, pin_settings(redis_client, settings()), RecordingPublisher(), source=data
    ).enqueue(iter_prompts(data))
    assert report.new == 2
    assert [r.row for r in report.rejected] == [2, 3, 4, 5]
    assert all(r.reason for r in report.rejected)
    assert redis_client.hlen(RunKeys(RUN).rejected) == 4


def test_a_crash_between_storing_and_publishing_is_repaired_by_the_next_enqueue(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given an enqueue whose broker connection died after 1 of 3 batches was published
    data = write_jsonl(tmp_path / "d.jsonl", rows(12))
    pinned = pin_settings(redis_client, settings())
    crashed = RecordingPublisher(fail_after=1)
    with pytest.raises(ConnectionError):
        Enqueuer(redis_client, pinned, crashed, source=data).enqueue(iter_prompts(data))
    # When enqueue is run again
    publisher = RecordingPublisher()
    report = Enqueuer(redis_client, pinned, publisher, source=data).enqueue(iter_prompts(data))
    # Then the unpublished batches are published, and every prompt is in some published batch
    assert report.new == 0 and report.already_there == 12
    published = set(crashed.published) | set(publisher.published)
    assert sorted(prompts_in_batches(redis_client, sorted(published))) == sorted(f"q{i}" for i in range(12))


def test_different_settings_for_an_existing_run_are_refused_with_the_difference(
    redis_client: redis.Redis,
) -> None:
    pin_settings(redis_client, settings(max_tokens=512))
    with pytest.raises(SettingsError, match=r"sampling\.max_tokens: pinned 512, given 32768"):
        pin_settings(redis_client, settings(max_tokens=32768))


def test_queued_batches_are_compressed_below_their_raw_size(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    text = "Explain, step by step, why the sky appears blue during the day and red at sunset. " * 10
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": f"q{i}", "prompt": text} for i in range(64)])
    publisher = RecordingPublisher()
    Enqueuer(
        redis_client, pin_settings(redis_client, settings(batch_size=32)), publisher, source=data
    ).enqueue(iter_prompts(data))
    stored = sum(redis_client.memory_usage(RunKeys(RUN).batch(b)) or 0 for b in publisher.published)
    assert stored < len(text) * 64


class SlowPublisher(RecordingPublisher):
    """Publishes only once told to: holds an enqueue at work while another one starts."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def __call__(self, run: str, batch_ids: Sequence[str]) -> None:
        self.go.wait(timeout=WAIT_S)
        super().__call__(run, batch_ids)


def test_two_enqueues_of_one_run_at_the_same_moment_never_place_a_prompt_in_two_batches(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given an enqueue of a run at work (its publishing held back)
    data = write_jsonl(tmp_path / "d.jsonl", rows(40))
    pinned = pin_settings(redis_client, settings())
    first = SlowPublisher()
    worker = threading.Thread(
        target=lambda: Enqueuer(redis_client, pinned, first, source=data).enqueue(iter_prompts(data))
    )
    worker.start()
    wait_until(lambda: redis_client.exists(RunKeys(RUN).enqueue_lock) == 1, timeout_s=WAIT_S, what="a lease")
    # When a second enqueue of the same data starts meanwhile, then it is refused, claiming nothing
    second = RecordingPublisher()
    with pytest.raises(EnqueueBusy, match="another enqueue of run"):
        Enqueuer(redis_client, pinned, second, source=data).enqueue(iter_prompts(data))
    first.go.set()
    worker.join(timeout=WAIT_S)
    # And every prompt is in exactly one batch
    assert second.published == []
    assert sorted(prompts_in_batches(redis_client, first.published)) == sorted(f"q{i}" for i in range(40))


def run_with_output(client: redis.Redis, tmp_path: Path) -> tuple[ObjectStore, RunSettings]:
    """A run pinned with an output folder holding its run.json, as `enqueue` leaves it."""
    store = open_store((tmp_path / "out").as_uri())
    pinned = pin_settings(client, msgspec.structs.replace(settings(), output=store.url))
    write_run_json(store, pinned)
    return store, pinned


def enqueue_into(
    client: redis.Redis,
    pinned: RunSettings,
    store: ObjectStore,
    data: str,
    publisher: RecordingPublisher | None = None,
) -> EnqueueReport:
    """`enqueue DATA` of a run whose output is `store`."""
    sending = publisher or RecordingPublisher()
    return Enqueuer(client, pinned, sending, source=data, store=store).enqueue(iter_prompts(data))


def run_enqueued_from_first_rows(
    client: redis.Redis, tmp_path: Path, count: int
) -> tuple[ObjectStore, RunSettings]:
    """A run with an output, its first `count` rows enqueued from first.jsonl."""
    store, pinned = run_with_output(client, tmp_path)
    enqueue_into(client, pinned, store, write_jsonl(tmp_path / "first.jsonl", rows(count)))
    return store, pinned


def test_after_redis_is_lost_and_recovered_a_changed_row_is_still_a_conflict_named_as_before(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a run enqueued from a folder into an output and committed, then Redis lost
    store, pinned = run_with_output(redis_client, tmp_path)
    folder = tmp_path / "shards"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", rows(3))
    enqueue_into(redis_client, pinned, store, str(folder))
    ledger = RunLedger(redis_client, RUN)
    for prompt_id in ("q0", "q1", "q2"):
        ledger.stage(completion(prompt_id))
    Uploader(redis_client, UploadSettings(max_age_s=0), lambda _run: store).flush(RUN)
    redis_client.flushall()
    # When it is recovered from its output, and a changed row of a committed prompt enqueued
    recovered = recover_run(redis_client, store, RUN)
    changed = write_jsonl(tmp_path / "changed.jsonl", [{"id": "q2", "prompt": "edited"}, *rows(1, start=3)])
    report = enqueue_into(redis_client, pinned, store, changed)
    # Then the changed row is refused, naming where the kept version came from; the new one is enqueued
    assert recovered.fingerprints == 3
    (conflict,) = report.conflicts
    assert f"conflicts with a.jsonl:3 of enqueue 1 ({folder} at " in conflict.reason
    assert report.new == 1
    assert read_enqueued_ids(store) == {"q0", "q1", "q2", "q3"}


def test_after_recover_an_uncommitted_prompt_is_queued_again_as_it_reads_now_and_a_change_is_counted(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a run enqueued into an output, nothing of it committed, then Redis lost and recovered
    store, pinned = run_enqueued_from_first_rows(redis_client, tmp_path, 2)
    redis_client.flushall()
    recover_run(redis_client, store, RUN)
    # When the data is enqueued again, one row edited meanwhile
    again = write_jsonl(tmp_path / "again.jsonl", [*rows(1), {"id": "q1", "prompt": "edited"}])
    publisher = RecordingPublisher()
    report = enqueue_into(redis_client, pinned, store, again, publisher)
    # Then both are queued again (the first texts went with Redis), the edited one counted, none refused
    assert (report.requeued_orphans, report.requeued_changed, report.conflict_count) == (2, 1, 0)
    assert sorted(prompts_in_batches(redis_client, publisher.published)) == ["q0", "q1"]


def test_a_run_enqueued_by_draftgen_0_1_0_is_refused_until_recover_moves_its_ids_and_fingerprints(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a run enqueued by 0.1.0, which kept its ids in one set and explicit ids' fingerprints beside it
    store, pinned = run_enqueued_from_first_rows(redis_client, tmp_path, 3)
    keys, ledger = RunKeys(RUN), RunLedger(redis_client, RUN)
    for prompt_id in ("q0", "q1", "q2"):
        holder = redis_client.hget(keys.ids(prompt_id), prompt_id)
        redis_client.sadd(keys.legacy_enqueued, prompt_id)
        redis_client.hset(
            keys.ids(prompt_id).replace(keys.ids_prefix, keys.legacy_fingerprints_prefix), prompt_id, holder
        )
        redis_client.delete(keys.ids(prompt_id))
    redis_client.delete(keys.enqueued_count)
    # When a command reads the run, then it is refused with what to run
    with pytest.raises(RunStateBroken, match=rf"recover --run {RUN} --output URL"):
        pinned_settings(redis_client, RUN)
    # And when recover has run, the ids and their fingerprints are where this version reads them
    recover_run(redis_client, store, RUN)
    assert pinned_settings(redis_client, RUN) == pinned
    assert (ledger.enqueued_ids(), ledger.counts().enqueued) == ({"q0", "q1", "q2"}, 3)
    assert not redis_client.exists(keys.legacy_enqueued)
    assert not list(redis_client.scan_iter(match=f"{keys.legacy_fingerprints_prefix}*"))
    changed = write_jsonl(tmp_path / "changed.jsonl", [{"id": "q2", "prompt": "edited"}, *rows(2)])
    report = enqueue_into(redis_client, pinned, store, changed)
    assert (report.new, report.already_there, report.conflict_count) == (0, 2, 1)


def test_the_metrics_of_other_runs_are_served_while_one_run_awaits_its_move_from_draftgen_0_1_0(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    run_enqueued_from_first_rows(redis_client, tmp_path, 2)
    legacy = RunKeys("legacy-run")
    pin_settings(redis_client, msgspec.structs.replace(settings(), run="legacy-run"))
    redis_client.sadd(legacy.legacy_enqueued, "q0")

    collector = DraftgenCollector(redis_client, lambda: ["legacy-run", RUN])
    enqueued = {
        sample.labels["run"]: sample.value
        for family in collector.collect()
        for sample in family.samples
        if sample.name == "draftgen_prompts_enqueued_total"
    }

    assert enqueued == {RUN: 2}
