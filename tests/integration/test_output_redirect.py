"""Redirecting a run's output in Redis writes nothing anywhere: the output's run.json must confirm it."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from tests.support.records import completion
from workers.record.manifest import read_manifest
from workers.record.object_store import ObjectStore
from workers.record.output_pin import write_run_json
from workers.record.storage import open_store
from workers.record.upload_settings import UploadSettings
from workers.record.uploader import Uploader
from workers.state.control import PAUSED_BY_OUTPUT_PIN, pause_state, resume
from workers.state.ledger import RunLedger
from workers.state.runs import encode_run_settings, load_run_settings

pytestmark = pytest.mark.integration
RUN = "pinned"
FIRST_ENQUEUE = "1"  # the holder of an id the run's first enqueue claimed (RunKeys.ids)
PROMPTS = ["a", "b", "c"]


def uploader_reading_redis(client: redis.Redis) -> Uploader:
    """An uploader that, as the worker's does, takes each run's output from Redis."""

    def store_for_run(run: str) -> ObjectStore:
        return open_store(load_run_settings(client, run).output)

    return Uploader(client, UploadSettings(max_age_s=0), store_for_run)


def enqueued_run(client: redis.Redis, output: Path) -> tuple[RunLedger, RunSettings]:
    """A run as `enqueue` leaves it (settings in Redis and run.json), its prompts staged."""
    settings = RunSettings(run=RUN, sampling=SamplingSettings(), output=output.as_uri())
    ledger = RunLedger(client, RUN)
    client.set(ledger.keys.settings, encode_run_settings(settings))
    write_run_json(open_store(settings.output), settings)
    ledger.hold_ids(dict.fromkeys(PROMPTS, FIRST_ENQUEUE))
    for prompt_id in PROMPTS:
        ledger.stage(completion(prompt_id))
    return ledger, settings


def redirect(client: redis.Redis, settings: RunSettings, output: Path) -> None:
    """What a writer with access to Redis could do: point the run's settings at another output."""
    moved = RunSettings(run=settings.run, sampling=settings.sampling, output=output.as_uri())
    client.set(RunLedger(client, RUN).keys.settings, encode_run_settings(moved))


def test_a_run_redirected_in_redis_commits_nothing_there_and_is_paused_with_the_reason(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a run enqueued to one output, then redirected in Redis to another
    ledger, settings = enqueued_run(redis_client, tmp_path / "out")
    redirect(redis_client, settings, tmp_path / "elsewhere")
    # When the uploader flushes it
    report = uploader_reading_redis(redis_client).flush(RUN)
    # Then nothing is written anywhere, the completions wait in Redis and the run is paused with why
    assert report.parts == 0
    assert not (tmp_path / "elsewhere").exists()
    assert read_manifest(open_store((tmp_path / "out").as_uri())) == []
    assert ledger.counts().staged == len(PROMPTS)
    state = pause_state(redis_client, RUN)
    assert state is not None and state.by == PAUSED_BY_OUTPUT_PIN
    assert "holds no run.json" in state.reason and str(tmp_path / "elsewhere") in state.reason


def test_once_redis_names_the_pinned_output_again_a_resumed_run_commits_there(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a redirected run the uploader refused
    ledger, settings = enqueued_run(redis_client, tmp_path / "out")
    redirect(redis_client, settings, tmp_path / "elsewhere")
    assert uploader_reading_redis(redis_client).flush(RUN).parts == 0
    # When its settings are put back and it is resumed
    redirect(redis_client, settings, tmp_path / "out")
    resume(redis_client, RUN)
    report = uploader_reading_redis(redis_client).flush(RUN)
    # Then its completions are committed to the output it was enqueued to
    assert report.completions == len(PROMPTS)
    assert [entry.count for entry in read_manifest(open_store(settings.output))] == [len(PROMPTS)]
    assert ledger.counts().staged == 0
