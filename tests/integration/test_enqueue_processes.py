"""One enqueue in several processes against a real Redis: the same run as one process makes, every id in
exactly one batch, and a part that stops (Ctrl-C, a lost lease, a kill) leaves the run whole."""

from __future__ import annotations

import base64
import json
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from core.records import Prompt, PromptBatch, SamplingSettings
from core.run_settings.model import RunSettings
from intake.reading import iter_prompts
from intake.rejected import RejectedRow
from producer.enqueue.enqueuer import Enqueuer, EnqueueReport, pin_settings
from producer.enqueue.processes import Part, PartFailed, PartSpec, enqueue_in_parts
from producer.enqueue.publisher import BatchPublisher
from producer.errors import EnqueueBusy, SourceError
from workers.broker.broker import sending_app
from workers.broker.kombu_layout import waiting_envelopes
from workers.record.output_pin import write_run_json
from workers.record.storage import open_store
from workers.settings import WorkerSettings
from workers.state.codec import decode_blob
from workers.state.keys import RunKeys
from workers.state.queues import GENERATE_QUEUE
from workers.state.record_limits import RECORD_LIMIT_BYTES

pytestmark = pytest.mark.integration
BATCH_SIZE = 4  # chunks of 128 rows: a few hundred rows make many chunks for every part
PARTS = 3


def dataset(path: Path, count: int) -> str:
    """`count` rows with ids, among them repeated ids: the same content again (a duplicate) and other content
    (a conflict, whose first version is kept), and rows that are not prompts."""
    lines = []
    for i in range(count):
        if i % 50 == 7:
            lines.append(json.dumps({"id": f"q{i - 7}", "prompt": f"question {i - 7}"}))  # duplicate
        elif i % 50 == 9:
            lines.append(json.dumps({"id": f"q{i - 9}", "prompt": f"changed {i}"}))  # conflict
        elif i % 50 == 11:
            lines.append(json.dumps({"id": f"q{i}"}))  # no prompt: rejected
        else:
            lines.append(json.dumps({"id": f"q{i}", "prompt": f"question {i}"}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def pinned_run(client: redis.Redis, tmp_path: Path, run: str) -> RunSettings:
    store = open_store((tmp_path / run).as_uri())
    settings = RunSettings(run=run, sampling=SamplingSettings(), output=store.url, batch_size=BATCH_SIZE)
    pinned = pin_settings(client, settings)
    write_run_json(store, pinned)
    return pinned


def enqueue(
    redis_url: str,
    settings: RunSettings,
    data: str,
    parts: int,
    items: Iterator[Prompt | RejectedRow] | None = None,
    started: list[Part] | None = None,
) -> EnqueueReport:
    """`enqueue DATA --processes parts`, as the command does it; `started` collects the parts."""

    def start(index: int, spec: PartSpec, session: object) -> Part:
        part = Part(index, spec, session)  # type: ignore[arg-type]
        (started if started is not None else []).append(part)
        return part

    client = redis.Redis.from_url(redis_url)
    broker = WorkerSettings(redis_url=redis_url).broker
    publisher = BatchPublisher(sending_app(broker))
    try:
        enqueuer = Enqueuer(client, settings, publisher, source=data, store=open_store(settings.output))
        rows = items if items is not None else iter_prompts(data)
        if parts == 1:
            return enqueuer.enqueue(rows)
        return enqueue_in_parts(enqueuer, rows, parts, redis_url=redis_url, broker=broker, start_part=start)
    finally:
        publisher.close()


def batched(client: redis.Redis, run: str) -> dict[str, list[str]]:
    """Every prompt the run's batches hold, by id: its text in each batch that holds it."""
    keys = RunKeys(run)
    held: dict[str, list[str]] = {}
    for key in client.scan_iter(match=f"{keys.batches_prefix}*", count=1000):
        for prompt in decode_blob(client.get(key), PromptBatch, limit_bytes=RECORD_LIMIT_BYTES).prompts:
            held.setdefault(prompt.id, []).append(prompt.messages[-1].content)
    return held


def published_batches(client: redis.Redis, run: str) -> Counter[str]:
    """How many messages in the queue carry each of the run's batches."""
    carried: Counter[str] = Counter()
    for raw in waiting_envelopes(client, GENERATE_QUEUE):
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        batch_run, batch_id = body[0]
        if batch_run == run:
            carried[batch_id] += 1
    return carried


def assert_whole(client: redis.Redis, run: str) -> dict[str, list[str]]:
    """Every id the run holds is in exactly one batch, and every batch is published or in the outbox."""
    keys = RunKeys(run)
    held = batched(client, run)
    assert {prompt_id: len(texts) for prompt_id, texts in held.items() if len(texts) != 1} == {}
    assert int(client.get(keys.enqueued_count) or 0) == len(held)
    stored = {
        key.decode().removeprefix(keys.batches_prefix) for key in client.scan_iter(f"{keys.batches_prefix}*")
    }
    outbox = {raw.decode() for raw in client.smembers(keys.unpublished)}
    assert stored == set(published_batches(client, run)) | outbox
    return held


def read_until(data: str, row: int, then: Callable[[], None]) -> Iterator[Prompt | RejectedRow]:
    """The rows of `data`, `then` called when reading reaches `row`."""
    for item in iter_prompts(data):
        if item.row == row:
            then()
        yield item


def a_re_run_completes(
    redis_url: str, client: redis.Redis, settings: RunSettings, data: str, prompts: int
) -> EnqueueReport:
    """Running the same enqueue again leaves the run whole, holding all `prompts` once; its report."""
    report = enqueue(redis_url, settings, data, parts=PARTS)
    assert len(assert_whole(client, settings.run)) == prompts
    return report


def counts(report: EnqueueReport) -> tuple[int, ...]:
    return (
        report.new,
        report.already_there,
        report.duplicates_in_input,
        report.conflict_count,
        report.rejected_count,
    )


def test_three_processes_enqueue_the_same_run_as_one_with_duplicates_and_conflicts_told_the_same(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = dataset(tmp_path / "d.jsonl", 1000)
    alone = enqueue(redis_url, pinned_run(redis_client, tmp_path, "alone"), data, parts=1)
    in_parts = enqueue(redis_url, pinned_run(redis_client, tmp_path, "parts"), data, parts=PARTS)

    assert counts(in_parts) == counts(alone) == (940, 0, 20, 20, 20)
    assert in_parts.conflicts == alone.conflicts  # the same rows shown, in input order
    assert in_parts.rejected == alone.rejected
    assert assert_whole(redis_client, "parts") == assert_whole(redis_client, "alone")  # first versions kept
    assert redis_client.scard(RunKeys("parts").unpublished) == 0

    alone_again = enqueue(redis_url, pinned_run(redis_client, tmp_path, "alone"), data, parts=1)
    again = enqueue(redis_url, pinned_run(redis_client, tmp_path, "parts"), data, parts=PARTS)
    assert counts(again) == counts(alone_again) == (0, 960, 0, 20, 20)  # a duplicate is there already too


def test_ctrl_c_in_the_reading_process_stops_every_part_with_the_counts_exactly_what_the_run_holds(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = dataset(tmp_path / "d.jsonl", 1000)
    settings = pinned_run(redis_client, tmp_path, "stopped")

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    report = enqueue(redis_url, settings, data, parts=PARTS, items=read_until(data, 600, ctrl_c))

    assert report.interrupted
    held = assert_whole(redis_client, "stopped")
    assert report.new == len(held) < 940
    rest = a_re_run_completes(redis_url, redis_client, settings, data, 940)
    assert rest.new == 940 - report.new


def test_a_lease_taken_over_meanwhile_stops_every_part_and_says_run_again(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = dataset(tmp_path / "d.jsonl", 1000)
    settings = pinned_run(redis_client, tmp_path, "taken")

    def taken_over() -> None:  # the lease ran out and another enqueue took it
        redis_client.set(RunKeys("taken").enqueue_lock, "another enqueue", px=60_000)

    with pytest.raises(EnqueueBusy, match="lost its lease"):
        enqueue(redis_url, settings, data, parts=PARTS, items=read_until(data, 300, taken_over))

    assert len(assert_whole(redis_client, "taken")) < 940
    redis_client.delete(RunKeys("taken").enqueue_lock)
    a_re_run_completes(redis_url, redis_client, settings, data, 940)


def test_a_part_killed_midway_ends_the_enqueue_with_one_message_and_running_again_adds_the_rest_once(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = dataset(tmp_path / "d.jsonl", 3000)
    settings = pinned_run(redis_client, tmp_path, "killed")
    started: list[Part] = []

    def kill_part_0() -> None:
        os.kill(started[0].pid, signal.SIGKILL)

    with pytest.raises(PartFailed, match=r"enqueue part 0 ended .* run the same command again"):
        enqueue(
            redis_url, settings, data, parts=PARTS, items=read_until(data, 1000, kill_part_0), started=started
        )

    assert_whole(redis_client, "killed")
    a_re_run_completes(redis_url, redis_client, settings, data, 2820)
    assert redis_client.scard(RunKeys("killed").unpublished) == 0


def test_input_that_fails_part_way_ends_every_part_with_its_chunks_enqueued_whole(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    data = dataset(tmp_path / "d.jsonl", 1000)
    settings = pinned_run(redis_client, tmp_path, "cut")
    started: list[Part] = []

    def unreadable() -> None:  # what a reader raises on a file corrupt part-way, or S3 gone
        raise SourceError(f"{data}: line 700 is cut short")

    with pytest.raises(SourceError, match="cut short"):
        enqueue(
            redis_url, settings, data, parts=PARTS, items=read_until(data, 700, unreadable), started=started
        )

    assert started and not any(Path(f"/proc/{part.pid}").exists() for part in started)
    assert 0 < len(assert_whole(redis_client, "cut")) < 940
    assert redis_client.exists(RunKeys("cut").enqueue_lock) == 0
    a_re_run_completes(redis_url, redis_client, settings, data, 940)
