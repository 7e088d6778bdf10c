"""The uploader against a real Redis and real object stores (a folder and S3 over HTTP)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import cast

import pandas as pd
import pytest
import redis

from core.records import DeadLetter, SamplingSettings
from core.run_settings.model import RunSettings
from producer.upkeep.gc import collect_orphans
from producer.upkeep.recover import recover_run
from producer.upkeep.verify import verify_run
from tests.support.records import completion, prompt
from workers.errors import RetryLater
from workers.record.manifest import DATA_PREFIX, ManifestEntry, encode_entry, manifest_key, read_manifest
from workers.record.object_store import ObjectStore
from workers.record.output_pin import write_run_json
from workers.record.parquet_io import completions_to_parquet
from workers.record.storage import open_store
from workers.record.upload_settings import UploadSettings
from workers.record.uploader import Uploader
from workers.state.ledger import RunLedger
from workers.state.runs import encode_run_settings, load_run_settings

pytestmark = pytest.mark.integration
RUN = "upload-test"
FIRST_ENQUEUE = "1"  # the holder of an id the run's first enqueue claimed (RunKeys.ids)
SHORT_LOCK_S = 1.0
SLOW_PUT_LOCK_TERMS = 2.5  # a part's write: two and a half lock terms


def start_run(client: redis.Redis, output: str, prompt_ids: list[str]) -> RunLedger:
    """A run as `enqueue` leaves it: settings pinned in Redis and in the output's run.json, ids enqueued."""
    ledger = RunLedger(client, RUN)
    settings = RunSettings(run=RUN, sampling=SamplingSettings(), output=output)
    client.set(ledger.keys.settings, encode_run_settings(settings))
    write_run_json(open_store(output), settings)
    ledger.hold_ids(dict.fromkeys(prompt_ids, FIRST_ENQUEUE))
    return ledger


def uploader(client: redis.Redis, store: ObjectStore, **settings: float) -> Uploader:
    return Uploader(client, UploadSettings(**settings), lambda _run: store)  # type: ignore[arg-type]


def commit_part_without_redis(store: ObjectStore, prompt_ids: list[str]) -> None:
    """What a flush that died between its manifest entry and its Redis commit leaves: part 0 committed."""
    data = completions_to_parquet([completion(prompt_id) for prompt_id in prompt_ids])
    key = "data/part-000000-crashed.parquet"
    store.put(key, data)
    entry = ManifestEntry(
        part=0,
        key=key,
        count=len(prompt_ids),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        committed_at=1.0,
    )
    store.put_if_absent(manifest_key(0), encode_entry(entry))


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "folder":
        return open_store((tmp_path / "out").as_uri())
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/runs/{RUN}")


def test_nothing_is_uploaded_before_a_part_is_due(redis_client: redis.Redis, store: ObjectStore) -> None:
    ledger = start_run(redis_client, store.url, [f"p{i}" for i in range(10)])
    for i in range(3):
        ledger.stage(completion(f"p{i}"))
    report = uploader(redis_client, store, max_completions=5, max_age_s=3600).flush(RUN)
    assert report.parts == 0
    assert list(store.list(DATA_PREFIX)) == []


def test_full_parts_are_committed_and_the_rest_waits(redis_client: redis.Redis, store: ObjectStore) -> None:
    ledger = start_run(redis_client, store.url, [f"p{i}" for i in range(20)])
    for i in range(12):
        ledger.stage(completion(f"p{i}"))
    report = uploader(redis_client, store, max_completions=5, max_age_s=3600).flush(RUN)
    assert (report.parts, report.completions) == (2, 10)
    assert [entry.count for entry in read_manifest(store)] == [5, 5]
    assert ledger.counts().staged == 2


def test_a_drained_run_flushes_its_last_partial_part(redis_client: redis.Redis, store: ObjectStore) -> None:
    ledger = start_run(redis_client, store.url, ["a", "b", "c"])
    ledger.stage(completion("a"))
    ledger.stage(completion("b"))
    ledger.dead_letter(
        DeadLetter(prompt_id="c", row=3, reason="rejected_by_server", error="too long", attempts=1)
    )
    report = uploader(redis_client, store, max_completions=1000, max_age_s=3600).flush(RUN)
    assert report.completions == 2
    assert verify_run(store, RUN, redis_client).ok


def test_old_completions_are_flushed_by_age(redis_client: redis.Redis, store: ObjectStore) -> None:
    ledger = start_run(redis_client, store.url, ["a", "b", "c"])
    ledger.stage(completion("a"))
    report = uploader(redis_client, store, max_completions=1000, max_age_s=0).flush(RUN)
    assert report.completions == 1


def test_the_byte_budget_splits_parts(redis_client: redis.Redis, store: ObjectStore) -> None:
    ledger = start_run(redis_client, store.url, [f"p{i}" for i in range(6)])
    for i in range(6):
        ledger.stage(completion(f"p{i}", size=2000))
    report = uploader(redis_client, store, max_completions=1000, max_bytes=1, max_age_s=3600).flush(RUN)
    assert (report.parts, report.completions) == (6, 6)


def test_committed_objects_read_back_in_pandas(
    redis_client: redis.Redis, store: ObjectStore, tmp_path: Path
) -> None:
    ledger = start_run(redis_client, store.url, ["a", "b"])
    ledger.stage(completion("a", content="\n\nforty-two"))
    ledger.stage(completion("b"))
    uploader(redis_client, store).flush(RUN)
    (entry,) = read_manifest(store)
    assert entry.key is not None
    local = tmp_path / "part.parquet"
    local.write_bytes(store.get(entry.key))
    frame = pd.read_parquet(local)
    assert sorted(frame["prompt_id"]) == ["a", "b"]
    assert frame.set_index("prompt_id").loc["a", "content"] == "\n\nforty-two"
    assert frame.iloc[0]["usage"]["reasoning_tokens"] == 7


def test_a_prompt_staged_twice_is_committed_once(redis_client: redis.Redis, store: ObjectStore) -> None:
    ledger = start_run(redis_client, store.url, ["a"])
    assert ledger.stage(completion("a"))
    assert not ledger.stage(completion("a", content="again"))
    uploader(redis_client, store).flush(RUN)
    assert not ledger.stage(completion("a", content="after commit"))
    report = verify_run(store, RUN, redis_client)
    assert report.ok and report.committed == 1


def test_a_flush_interrupted_after_its_manifest_entry_is_adopted_not_repeated(
    redis_client: redis.Redis, store: ObjectStore
) -> None:
    # Given a flush that wrote part 0 and its manifest entry, then died before marking Redis
    ledger = start_run(redis_client, store.url, ["a", "b", "c"])
    for prompt_id in "abc":
        ledger.stage(completion(prompt_id))
    commit_part_without_redis(store, ["a", "b"])
    # When the next flush runs
    report = uploader(redis_client, store).flush(RUN)
    # Then part 0 is adopted as it was, c goes into part 1, and nothing is committed twice
    assert report.adopted_parts == 1
    assert [entry.count for entry in read_manifest(store)] == [2, 1]
    result = verify_run(store, RUN, redis_client)
    assert result.ok, result
    assert result.committed == 3
    # and the object the second flush wrote for part 0 is an orphan that gc removes
    orphans = collect_orphans(store)
    assert len(orphans.removed) == 1 and orphans.removed[0].startswith("data/part-000000-")


def test_a_second_flush_of_the_same_run_waits_for_the_first(
    redis_client: redis.Redis, store: ObjectStore
) -> None:
    ledger = start_run(redis_client, store.url, ["a"])
    ledger.stage(completion("a"))
    redis_client.set(ledger.keys.upload_lock, "someone-else")
    with pytest.raises(RetryLater, match="another flush"):
        uploader(redis_client, store).flush(RUN)
    assert ledger.counts().staged == 1


def test_verify_reports_a_prompt_that_was_never_committed(
    redis_client: redis.Redis, store: ObjectStore
) -> None:
    ledger = start_run(redis_client, store.url, ["a", "b"])
    ledger.stage(completion("a"))
    uploader(redis_client, store, max_age_s=0).flush(RUN)
    report = verify_run(store, RUN, redis_client)
    assert not report.ok
    assert report.missing == ["b"]


def test_pending_skips_prompts_already_staged_done_or_dead(
    redis_client: redis.Redis, store: ObjectStore
) -> None:
    ledger = start_run(redis_client, store.url, ["a", "b", "c", "d"])
    ledger.stage(completion("a"))
    ledger.dead_letter(DeadLetter(prompt_id="b", row=2, reason="x", error="y", attempts=1))
    redis_client.sadd(ledger.keys.done, "c")
    assert [p.id for p in ledger.pending([prompt(i) for i in "abcd"])] == ["d"]


def test_recover_on_a_live_redis_takes_committed_prompts_out_of_the_upload_path(
    redis_client: redis.Redis, store: ObjectStore
) -> None:
    # Given a flush that committed part 0 in the object store, then died before marking Redis
    ledger = start_run(redis_client, store.url, ["a", "b", "c"])
    for prompt_id in "abc":
        ledger.stage(completion(prompt_id))
    write_run_json(store, load_run_settings(redis_client, RUN))
    commit_part_without_redis(store, ["a", "b"])
    # When the run is recovered from its output, then flushed
    report = recover_run(redis_client, store, RUN)
    uploader(redis_client, store, max_age_s=0).flush(RUN)
    # Then a and b count once, c goes into part 1, and nothing is committed twice
    assert (report.committed, report.newly_marked_done) == (2, 2)
    assert [e.count for e in read_manifest(store)] == [2, 1]
    result = verify_run(store, RUN, redis_client)
    assert result.ok, result


class SlowStore:
    """A folder whose every data object takes longer to write than the upload lock's term."""

    def __init__(self, inner: ObjectStore, put_s: float) -> None:
        self._inner = inner
        self._put_s = put_s
        self.url = inner.url

    def put(self, key: str, data: bytes) -> None:
        if key.startswith(DATA_PREFIX):
            time.sleep(self._put_s)
        self._inner.put(key, data)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_a_part_whose_write_outlasts_the_upload_lock_is_still_committed(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a store so slow that writing one part takes longer than the upload lock's term
    folder = open_store((tmp_path / "out").as_uri())
    ledger = start_run(redis_client, folder.url, ["a", "b"])
    ledger.stage(completion("a"))
    ledger.stage(completion("b"))
    slow = cast(ObjectStore, SlowStore(folder, put_s=SLOW_PUT_LOCK_TERMS * SHORT_LOCK_S))
    # When a flush writes it
    flushing = uploader(redis_client, slow, max_completions=1000, max_age_s=3600, lock_s=SHORT_LOCK_S)
    report = flushing.flush(RUN)
    # Then the lock was kept meanwhile, and the part committed (a lock extended only between parts ran out
    # in every write, and the run never committed anything)
    assert (report.parts, report.completions) == (1, 2)
    assert verify_run(folder, RUN, redis_client).ok
