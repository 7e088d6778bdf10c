"""Parked messages are not silent: `status` warns with their count and reasons, `parked` lists them, and the
metrics exporter counts them by queue and reason."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from producer.cli import main as producer_main
from producer.enqueue.enqueuer import pin_settings
from producer.settings import REDIS_URL_ENV
from producer.status.gather import gather_status
from producer.status.metrics import DraftgenCollector
from workers.broker.parked_messages import ParkedCount, park, parked_message
from workers.errors import MalformedMessage
from workers.state.queues import GENERATE_QUEUE, UPLOAD_QUEUE

RUN = "parked-views"
PARKED_METRIC = "draftgen_parked_messages"


@pytest.fixture
def two_parked(redis_client: redis.Redis) -> redis.Redis:
    """One message parked from `generate` (not JSON) and one from `upload` (bad arguments)."""
    for raw, queue, reason in ((b"x", GENERATE_QUEUE, "not_json"), (b"{}", UPLOAD_QUEUE, "bad_arguments")):
        park(redis_client, parked_message(raw, queue, MalformedMessage(reason, "why"), at=time.time()))
    return redis_client


def test_status_names_how_many_messages_were_parked_and_why(two_parked: redis.Redis, tmp_path: Path) -> None:
    settings = RunSettings(run=RUN, sampling=SamplingSettings(), output=(tmp_path / "out").as_uri())
    pin_settings(two_parked, settings)

    status = gather_status(two_parked, RUN)

    assert status.parked_messages == [
        ParkedCount(queue=GENERATE_QUEUE, reason="not_json", count=1),
        ParkedCount(queue=UPLOAD_QUEUE, reason="bad_arguments", count=1),
    ]
    [warning] = [warning for warning in status.warnings if "parked" in warning]
    assert warning.startswith(
        "2 malformed messages parked, never delivered (generate not_json 1, upload bad_a"
    )
    assert "`python -m producer parked` lists them" in warning


def test_parked_lists_the_newest_first_with_reason_queue_size_and_preview(
    two_parked: redis.Redis,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REDIS_URL_ENV, redis_url)
    assert producer_main(["parked", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(m["queue"], m["reason"], m["size"], m["preview"]) for m in listed["newest"]] == [
        (UPLOAD_QUEUE, "bad_arguments", 2, "{}"),
        (GENERATE_QUEUE, "not_json", 1, "x"),
    ]
    assert producer_main(["parked"]) == 0
    assert "upload  bad_arguments: why  (2 bytes)" in capsys.readouterr().out


def test_the_metrics_count_parked_messages_by_queue_and_reason(two_parked: redis.Redis) -> None:
    [family] = [
        metric for metric in DraftgenCollector(two_parked, list).collect() if metric.name == PARKED_METRIC
    ]
    counted = {
        (s.labels["queue"], s.labels["reason"]): s.value for s in family.samples if s.name.endswith("_total")
    }
    assert counted == {(GENERATE_QUEUE, "not_json"): 1, (UPLOAD_QUEUE, "bad_arguments"): 1}
