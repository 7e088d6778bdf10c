"""A generate worker taking nothing while batches wait and its GPU idles says so, then exits to restart."""

from __future__ import annotations

import redis

from tests.support.clock import ManualClock
from workers.recovery.consumer_watch import (
    EXIT_NOT_CONSUMING,
    ConsumerFigures,
    ConsumerWatch,
    NotConsumingJudge,
)
from workers.state.exit_notes import read_exit_notes
from workers.state.queues import GENERATE_QUEUE

LIMIT_S = 120.0
LABEL = "node-a/gpu0"


def idle_beside(waiting: int | None) -> ConsumerFigures:
    return ConsumerFigures(waiting=waiting, held=0, taking=True)


def test_idle_beside_waiting_work_counts_up_from_the_first_sight() -> None:
    judge = NotConsumingJudge()
    assert judge.observe(0.0, idle_beside(5)) == 0.0
    assert judge.observe(30.0, idle_beside(5)) == 30.0


def test_holding_a_request_an_empty_queue_or_a_hung_server_is_not_deafness_and_starts_the_count_again() -> (
    None
):
    judge = NotConsumingJudge()
    judge.observe(0.0, idle_beside(5))
    for consuming in (
        ConsumerFigures(waiting=5, held=1, taking=True),
        idle_beside(0),
        idle_beside(None),  # Redis did not answer: nobody can consume
        ConsumerFigures(waiting=5, held=0, taking=False),  # liveness stopped it: its server is hung
    ):
        assert judge.observe(50.0, consuming) is None
        assert judge.observe(60.0, idle_beside(5)) == 0.0


def watch_over(client: redis.Redis, clock: ManualClock, held: list[int], exits: list[int]) -> ConsumerWatch:
    return ConsumerWatch(
        client,
        LABEL,
        held=lambda: held[0],
        taking=lambda: True,
        stop_worker=exits.append,
        limit_s=LIMIT_S,
        clock=clock,
    )


def test_a_worker_deaf_past_the_limit_leaves_a_note_for_status_and_exits_to_be_restarted(
    redis_client: redis.Redis,
) -> None:
    # Given batches waiting in the generate queue and a worker that holds none of them
    redis_client.rpush(GENERATE_QUEUE, b"batch-1", b"batch-2")
    clock, held, exits = ManualClock(), [0], list[int]()
    watch = watch_over(redis_client, clock, held, exits)

    # When it takes nothing for just under the limit, it only warns
    watch.check()
    clock.now += LIMIT_S - 1
    watch.check()
    assert exits == [] and watch.not_consuming_s == LIMIT_S - 1

    # Then at the limit it exits with 75, once, and status can tell why
    clock.now += 1
    watch.check()
    clock.now += 10
    watch.check()
    assert exits == [EXIT_NOT_CONSUMING]
    note = read_exit_notes(redis_client)[LABEL]
    assert "took no message for 120 s while 2 waited in the generate queue" in note


def test_a_worker_that_takes_a_batch_before_the_limit_keeps_running(redis_client: redis.Redis) -> None:
    redis_client.rpush(GENERATE_QUEUE, b"batch-1")
    clock, held, exits = ManualClock(), [0], list[int]()
    watch = watch_over(redis_client, clock, held, exits)
    watch.check()
    clock.now += LIMIT_S - 1
    held[0] = 1  # it received one
    watch.check()
    held[0] = 0
    clock.now += LIMIT_S - 1
    watch.check()
    assert exits == [] and read_exit_notes(redis_client) == {}
