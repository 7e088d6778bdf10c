"""A GPU's seat on a real redis-server: one live worker per GPU label, and a successor takes back what a
dead one held under that label, and nothing else, as soon as the dead one has been silent longer than a
live holder ever is (across Redis restarts, failovers and dropped connections)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from devstack.local_stack import RedisProcess, free_port, redis_process, start_redis
from producer.enqueue.enqueuer import Enqueuer
from tests.support.dispatch import RecordingDispatcher
from tests.support.records import prompt
from workers.errors import SeatHeld
from workers.recovery.leases import Acquired, LeaseKeeper
from workers.recovery.reconciler import Reconciler, ReconcileSettings
from workers.recovery.seat import Seat
from workers.state.redis_client import connect

pytestmark = pytest.mark.integration

RUN = "seats"
LABEL = "node-a/gpu0"
LONG_S = 3600.0


def batches(client: redis.Redis, count: int) -> list[str]:
    published: list[str] = []

    def publish(_run: str, batch_ids: Sequence[str]) -> None:
        published.extend(batch_ids)

    settings = RunSettings(run=RUN, sampling=SamplingSettings(), output="file:///tmp/x", batch_size=1)
    Enqueuer(client, settings, publish, source="test").enqueue(prompt(f"p{i}") for i in range(count))
    client.sadd("draftgen:runs", RUN)
    return published


def die(seat: Seat) -> None:
    """What SIGKILL does to a seated process: nothing of it runs again, and the kernel closes its sockets."""
    seat._keeper.stop()
    seat._pubsub.connection.disconnect()  # type: ignore[union-attr]


def never_lost(reason: str) -> None:
    raise AssertionError(f"the seat was lost: {reason}")


def take_back(client: redis.Redis, seat: Seat) -> list[str]:
    dispatcher = RecordingDispatcher()
    reconciler = Reconciler(client, dispatcher, ReconcileSettings(upload_max_age_s=LONG_S))
    reconciler.take_back_seat(seat.take(), seat.label)
    assert dispatcher.resumed == dispatcher.generated  # each before every batch not begun
    return [batch_id for _run, batch_id in dispatcher.generated]


def test_a_second_worker_on_a_gpu_whose_worker_lives_is_refused(redis_url: str) -> None:
    first = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    first.take()

    with pytest.raises(SeatHeld, match=LABEL):
        Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost).take()
    first.release()


def test_a_worker_whose_predecessor_died_takes_back_its_leases_and_no_others(
    redis_client: redis.Redis, redis_url: str
) -> None:
    dead_batch, other_gpu_batch = batches(redis_client, 2)
    predecessor = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    predecessor.take()
    LeaseKeeper(redis_client, worker=LABEL, seat=predecessor.token, ttl_s=LONG_S).acquire(RUN, dead_batch)
    LeaseKeeper(redis_client, worker="node-b/gpu0", seat="b", ttl_s=LONG_S).acquire(RUN, other_gpu_batch)
    die(predecessor)

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

    second = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    taken = second.take()

    assert taken.previous == ""
    assert redis.Redis.from_url(redis_url).get(f"draftgen:seats:{LABEL}") == taken.token.encode()
    second.release()


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


def held_by_another(client: redis.Redis, batch_id: str) -> bool:
    return LeaseKeeper(client, worker="anyone").acquire(RUN, batch_id)[0] is Acquired.HELD


def test_a_newcomer_while_the_holder_s_subscription_is_down_is_refused_and_takes_nothing(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # Given a live worker seated on its GPU with a batch leased, whose keeper runs as in a worker
    (batch_id,) = batches(redis_client, 1)
    holder = Seat(connect(redis_url), LABEL, on_lost=never_lost)
    holder.take()
    LeaseKeeper(redis_client, worker=LABEL, seat=holder.token, ttl_s=LONG_S).acquire(RUN, batch_id)
    # When Redis drops every subscription (as a restart or a failover does) and a second process starts
    # on the same GPU label at that very moment
    redis_client.client_kill_filter(_type="pubsub")

    # Then the newcomer is refused, and the live worker keeps its seat and its batch
    with pytest.raises(SeatHeld, match=LABEL):
        take_back(redis_client, Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost))
    holder.check()
    assert redis_client.get(f"draftgen:seats:{LABEL}") == holder.token.encode()
    assert held_by_another(redis_client, batch_id)
    holder.release()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test's own, to restart."""
    process = start_redis(free_port(), tmp_path / "data", tmp_path / "first-life")
    yield process
    process.stop()


def restart(process: RedisProcess, log_dir: Path) -> RedisProcess:
    """SIGTERM redis-server and start it again on its port and data (AOF): every connection drops."""
    process.stop()
    data_dir = Path(process.argv[process.argv.index("--dir") + 1])
    again = redis_process(process.port, data_dir, log_dir)
    again.start()
    again.wait_for_log("Ready to accept connections")
    return again


@pytest.mark.parametrize("seat_after_the_restart", ["kept", "lost with the last writes"])
def test_a_seat_holder_lives_through_a_redis_restart_and_a_newcomer_the_moment_it_is_back_is_refused(
    own_redis: RedisProcess, tmp_path: Path, seat_after_the_restart: str
) -> None:
    # Given a live worker seated on its GPU, holding a batch
    client = redis.Redis.from_url(own_redis.url)
    (batch_id,) = batches(client, 1)
    losses: list[str] = []
    holder = Seat(connect(own_redis.url), LABEL, on_lost=losses.append)
    holder.take()
    LeaseKeeper(client, worker=LABEL, seat=holder.token, ttl_s=LONG_S).acquire(RUN, batch_id)

    # When Redis restarts (without the seat, when it lost its last writes), and a second process starts on
    # the same GPU label the moment it is back
    if seat_after_the_restart != "kept":
        client.delete(f"draftgen:seats:{LABEL}", f"draftgen:seats:{LABEL}:seen")
    again = restart(own_redis, tmp_path / "second-life")
    try:
        with pytest.raises(SeatHeld, match=LABEL):
            take_back(client, Seat(redis.Redis.from_url(again.url), LABEL, on_lost=never_lost))

        # Then the live worker keeps its seat and its batch, and is never told it lost them
        holder.check()
        assert client.get(f"draftgen:seats:{LABEL}") == holder.token.encode()
        assert held_by_another(client, batch_id)
        assert losses == []
        holder.release()
    finally:
        again.stop()


class StepClock:
    """A newcomer's own clock, moved on by its waits: watching a seat for seconds takes no time here."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def test_a_holder_that_shows_it_lives_but_cannot_listen_is_not_replaced(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # Given a live worker that keeps stamping its seat but whose subscription cannot be made again
    holder = Seat(connect(redis_url), LABEL, on_lost=never_lost)
    holder.take()
    holder._pubsub.unsubscribe()  # type: ignore[union-attr]
    holder._pubsub.get_message(timeout=1.0)  # type: ignore[union-attr]

    # When a second process watches the seat for as long as a vacant one is watched
    clock = StepClock()
    client = redis.Redis.from_url(redis_url)
    newcomer = Seat(client, LABEL, on_lost=never_lost, clock=clock, sleep=clock.sleep)

    # Then it is refused: the holder's stamps say it lives
    with pytest.raises(SeatHeld, match=LABEL):
        newcomer.take()
    assert redis_client.get(f"draftgen:seats:{LABEL}") == holder.token.encode()
    holder.release()


@pytest.mark.parametrize("given_back_to", ["the dead predecessor", "an older dead holder", "nobody"])
def test_a_holder_whose_seat_a_rollback_gave_back_takes_it_again_and_goes_on(
    redis_client: redis.Redis, redis_url: str, given_back_to: str
) -> None:
    # Given a worker seated on its GPU in the place of a dead one
    predecessor = "d" * 32
    redis_client.set(f"draftgen:seats:{LABEL}", predecessor)
    losses: list[str] = []
    clock = StepClock()
    holder = Seat(connect(redis_url), LABEL, on_lost=losses.append, clock=clock, sleep=clock.sleep)
    assert holder.take().previous == predecessor
    # When Redis comes back from a crash without its last second of writes: the seat names the dead
    # process the worker took it from, or nobody
    if given_back_to == "nobody":
        redis_client.delete(f"draftgen:seats:{LABEL}")
    else:
        older = {"the dead predecessor": predecessor, "an older dead holder": "c" * 32}[given_back_to]
        redis_client.set(f"draftgen:seats:{LABEL}", older)

    holder.check()

    # Then the worker holds its seat again and goes on
    assert redis_client.get(f"draftgen:seats:{LABEL}") == holder.token.encode()
    assert losses == []
    holder.release()


def test_a_holder_whose_seat_a_live_process_holds_stops(redis_client: redis.Redis, redis_url: str) -> None:
    losses: list[str] = []
    holder = Seat(connect(redis_url), LABEL, on_lost=losses.append)
    holder.take()
    other = redis.Redis.from_url(redis_url).pubsub()
    other.subscribe(f"draftgen:seat:{LABEL}:{'e' * 32}")
    other.get_message(timeout=1.0)
    redis_client.set(f"draftgen:seats:{LABEL}", "e" * 32)

    holder.check()

    assert len(losses) == 1 and "taken by another worker" in losses[0]
    other.close()
    holder.release()
