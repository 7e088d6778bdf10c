"""What Flower is told of a batch (workers/generate/batch_life.py), the worker's own output rates
(workers/generate/recent_output.py) and the queues its Broker page lists (workers/flower_queues.py),
without Celery: a fake dispatcher records the events as Celery's would send them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.clock import ManualClock
from workers.flower_queues import with_every_queue
from workers.generate.batch_life import BatchLife
from workers.generate.batches import BatchReport
from workers.generate.recent_output import RecentOutput
from workers.state.queues import GENERATE_QUEUE, GENERATE_TASK, UPLOAD_QUEUE

TASK = "3f0c-task-id"


class RecordingDispatcher:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def send(self, type: str, **fields: object) -> None:
        self.events.append((type, dict(fields)))

    def types(self) -> list[str]:
        return [type for type, _ in self.events]


class BrokenDispatcher:
    def send(self, type: str, **fields: object) -> None:
        raise ConnectionError("Redis is away")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def dispatcher() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def life(clock: ManualClock, dispatcher: RecordingDispatcher) -> BatchLife:
    life = BatchLife(GENERATE_TASK, clock=clock)
    life.attach(dispatcher)
    return life


def test_a_batch_taken_is_received_and_started_under_its_messages_task_id(
    life: BatchLife, dispatcher: RecordingDispatcher
) -> None:
    life.began(TASK, "run-a", "w9.00ff", retries=2)

    assert dispatcher.types() == ["task-received", "task-started"]
    received = dispatcher.events[0][1]
    assert received["uuid"] == TASK and dispatcher.events[1][1]["uuid"] == TASK
    assert (received["name"], received["args"], received["retries"]) == (
        GENERATE_TASK,
        "['run-a', 'w9.00ff']",
        2,
    )
    assert life.in_flight() == 1


def test_a_batch_succeeds_with_its_whole_life_as_runtime_and_its_figures_as_result(
    life: BatchLife, dispatcher: RecordingDispatcher, clock: ManualClock
) -> None:
    life.began(TASK, "run-a", "w9.00ff")
    clock.now += 312.5  # the batch's last request ends minutes after its message was acknowledged
    report = BatchReport(
        "w9.00ff", prompts=32, generated=31, dead_lettered=1, skipped=0, output_tokens=98_765
    )
    life.succeeded(TASK, report.summary())

    type, fields = dispatcher.events[-1]
    assert type == "task-succeeded"
    assert fields["runtime"] == pytest.approx(312.5)
    assert (
        fields["result"]
        == "31 generated (98,765 output tokens), 1 dead-lettered, 0 already done, of 32 prompts"
    )
    assert life.in_flight() == 0


def test_a_handed_back_batch_is_retried_and_a_given_up_one_failed_with_the_reason(
    life: BatchLife, dispatcher: RecordingDispatcher
) -> None:
    life.began(TASK, "run-a", "w9.00ff")
    life.retried(TASK, "48 prompts got no answer from http://gpu0:30000 (connection refused)")
    life.began("another", "run-a", "w9.0100")
    life.failed("another", "given up after 5 failures: ValueError: bad")

    by_type = {type: fields for type, fields in dispatcher.events}
    assert by_type["task-retried"]["exception"].startswith("48 prompts got no answer")
    assert by_type["task-failed"]["exception"] == "given up after 5 failures: ValueError: bad"
    assert life.in_flight() == 0


def test_events_that_cannot_be_sent_are_dropped_and_the_batch_goes_on(clock: ManualClock) -> None:
    life = BatchLife(GENERATE_TASK, clock=clock)
    life.began(TASK, "run-a", "b")  # no dispatcher yet (the consumer has not started)
    life.attach(BrokenDispatcher())
    life.succeeded(TASK, "done")  # Redis away: nothing raised
    assert life.in_flight() == 0


def test_the_workers_output_rates_count_the_last_minute_since_its_first_completion(
    clock: ManualClock,
) -> None:
    recent = RecentOutput(clock=clock)
    assert recent.rates().output_tokens_per_s == 0.0
    recent.record(1_000)
    clock.now += 20.0
    recent.record(3_000)
    rates = recent.rates()
    assert (rates.window_s, rates.completions, rates.output_tokens) == (20.0, 2, 4_000)
    assert rates.output_tokens_per_s == pytest.approx(200.0)
    assert rates.completions_per_minute == pytest.approx(6.0)

    clock.now += 50.0  # the first completion left the minute
    rates = recent.rates()
    assert (rates.window_s, rates.completions, rates.output_tokens) == (60.0, 1, 3_000)


def test_flowers_broker_page_lists_both_queues_whatever_its_workers_answered() -> None:
    assert with_every_queue([]) == sorted([GENERATE_QUEUE, UPLOAD_QUEUE])
    assert with_every_queue([GENERATE_QUEUE]) == sorted([GENERATE_QUEUE, UPLOAD_QUEUE])
    assert with_every_queue(["other", UPLOAD_QUEUE]) == sorted(["other", GENERATE_QUEUE, UPLOAD_QUEUE])
