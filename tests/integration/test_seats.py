"""A GPU's seat on a real redis-server: one live worker per GPU label, and a successor takes back at once
what a dead one held under that label, and nothing else."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import redis

from inference.records import SamplingSettings
from producer.enqueue import Enqueuer
from tests.support.dispatch import RecordingDispatcher
from tests.support.records import prompt
from workers.errors import SeatHeld
from workers.recovery.leases import Acquired, LeaseKeeper
from workers.recovery.reconciler import Reconciler, ReconcileSettings
from workers.recovery.seat import Seat
from workers.state.redis_client import connect
from workers.state.runs import RunSettings

pytestmark = pytest.mark.integration

RUN = "seats"
LABEL = "node-a/gpu0"
LONG_S = 3600.0


def batches(client: redis.Redis, count: int) -> list[str]:
    published: list[str] = []

    def publish(_run: str, batch_ids: Sequence[str]) -> None:
        published.extend(batch_ids)

    settings = RunSettings(run=RUN, sampling=SamplingSettings(), output_url="file:///tmp/x", batch_size=1)
    Enqueuer(client, settings, publish, source="test").enqueue(prompt(f"p{i}") for i in range(count))
    client.sadd("draftgen:runs", RUN)
    return published


def never_lost(reason: str) -> None:
    raise AssertionError(f"the seat was lost: {reason}")


def take_back(client: redis.Redis, seat: Seat) -> list[str]:
    dispatcher = RecordingDispatcher()
    reconciler = Reconciler(client, dispatcher, ReconcileSettings(upload_max_age_s=LONG_S))
    reconciler.take_back_seat(seat.take(), seat.label)
    return [batch_id for _run, batch_id in dispatcher.generated]


def test_a_second_worker_on_a_gpu_whose_worker_lives_is_refused(redis_url: str) -> None:
    first = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    first.take()

    with pytest.raises(SeatHeld, match=LABEL):
        Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost).take()
    first.release()


def test_a_worker_whose_predecessor_died_takes_back_its_leases_at_once_and_no_others(
    redis_client: redis.Redis, redis_url: str
) -> None:
    dead_batch, other_gpu_batch = batches(redis_client, 2)
    predecessor_client = redis.Redis.from_url(redis_url)
    predecessor = Seat(predecessor_client, LABEL, on_lost=never_lost)
    predecessor.take()
    LeaseKeeper(redis_client, worker=LABEL, seat=predecessor.token, ttl_s=LONG_S).acquire(RUN, dead_batch)
    LeaseKeeper(redis_client, worker="node-b/gpu0", seat="b", ttl_s=LONG_S).acquire(RUN, other_gpu_batch)
    predecessor_client.close()  # what the kernel does to a SIGKILLed process's sockets
    predecessor._pubsub.connection.disconnect()  # type: ignore[union-attr]

    successor = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    dispatched = take_back(redis_client, successor)

    assert dispatched == [dead_batch]
    keeper = LeaseKeeper(redis_client, worker="anyone")
    assert keeper.acquire(RUN, dead_batch)[0] is Acquired.ACQUIRED
    assert keeper.acquire(RUN, other_gpu_batch)[0] is Acquired.HELD
    successor.release()


def test_a_seat_given_up_on_a_clean_stop_is_taken_without_a_word(redis_url: str) -> None:
    first = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    first.take()
    first.release()

    taken = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost).take()

    assert taken.previous == ""
    assert redis.Redis.from_url(redis_url).get(f"draftgen:seats:{LABEL}") == taken.token.encode()


def test_a_seat_survives_a_redis_restart_of_its_holder(redis_url: str) -> None:
    client = connect(redis_url)  # the workers' client, with its retry layer
    seat = Seat(client, LABEL, on_lost=never_lost)
    seat.take()
    client.client_kill_filter(_type="pubsub")  # the subscription's connection drops, as in a restart

    seat.check()  # reconnects and subscribes again
    seat.check()

    with pytest.raises(SeatHeld):
        Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost).take()
    seat.release()
