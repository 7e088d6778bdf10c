"""The reconciler reads kombu's Redis layout (workers/broker/kombu_layout.py): these fail if kombu moves."""

from __future__ import annotations

import pytest
import redis

from workers.app import make_app
from workers.broker.kombu_layout import drop_unacked_of_batches, waiting_generate_batches, waiting_messages
from workers.settings import WorkerSettings
from workers.state.dispatch import CeleryDispatcher
from workers.state.queues import GENERATE_QUEUE, GENERATE_TASK, KOMBU_UNACKED_INDEX_KEY, KOMBU_UNACKED_KEY

pytestmark = pytest.mark.integration

ENOUGH_MESSAGES = 100
RECEIVE_TIMEOUT_S = 5.0


def test_a_published_generate_message_is_read_from_the_queue_as_its_run_and_batch(redis_url: str) -> None:
    app = make_app(WorkerSettings(redis_url=redis_url))
    app.send_task(GENERATE_TASK, args=["run-a", "batch-1"])
    client = redis.Redis.from_url(redis_url)
    assert waiting_generate_batches(client, max_messages=ENOUGH_MESSAGES) == {("run-a", "batch-1")}


def test_a_long_queue_is_not_read(redis_url: str) -> None:
    app = make_app(WorkerSettings(redis_url=redis_url))
    for batch in ("b1", "b2"):
        app.send_task(GENERATE_TASK, args=["run-a", batch])
    assert waiting_generate_batches(redis.Redis.from_url(redis_url), max_messages=1) is None


def test_a_delivered_unacknowledged_message_is_dropped_by_its_batch(redis_url: str) -> None:
    # Given a generate message delivered to a consumer that never acknowledges it (a killed worker)
    app = make_app(WorkerSettings(redis_url=redis_url))
    task_id = app.send_task(GENERATE_TASK, args=["run-a", "batch-1"]).id
    app.send_task(GENERATE_TASK, args=["run-a", "batch-2"])  # another, still waiting
    client = redis.Redis.from_url(redis_url)
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(GENERATE_QUEUE)
        message = queue.get(block=True, timeout=RECEIVE_TIMEOUT_S)
        assert message.headers["id"] == task_id
        assert client.hlen(KOMBU_UNACKED_KEY) == 1
        # When its batch is dispatched again and the old copy dropped (another batch's is left alone)
        assert drop_unacked_of_batches(client, "run-a", ["batch-9"]) == 0
        assert drop_unacked_of_batches(client, "run-a", ["batch-1"]) == 1
        # Then kombu holds it no longer (nothing to restore after the visibility timeout)
        assert (client.hlen(KOMBU_UNACKED_KEY), client.zcard(KOMBU_UNACKED_INDEX_KEY)) == (0, 0)
        queue.close()
    assert waiting_generate_batches(client, max_messages=ENOUGH_MESSAGES) == {("run-a", "batch-2")}


def test_a_batch_dispatched_again_once_begun_is_delivered_before_new_ones_sent_earlier(
    redis_url: str,
) -> None:
    # Given two new batches waiting, then a batch taken back from a dead worker (its work had begun)
    app = make_app(WorkerSettings(redis_url=redis_url))
    dispatcher = CeleryDispatcher(app)
    dispatcher.generate("run-a", "new-1")
    dispatcher.generate("run-a", "new-2")
    dispatcher.generate("run-a", "taken-back", resumed=True)
    client = redis.Redis.from_url(redis_url)
    # Then the queue holds all three, and the reconciler sees each of them waiting
    assert waiting_messages(client, GENERATE_QUEUE) == 3
    assert waiting_generate_batches(client, max_messages=ENOUGH_MESSAGES) == {
        ("run-a", "new-1"),
        ("run-a", "new-2"),
        ("run-a", "taken-back"),
    }
    # And a consumer takes the one taken back first, then the new ones in the order they were sent
    delivered = []
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(GENERATE_QUEUE)
        for _ in range(3):
            message = queue.get(block=True, timeout=RECEIVE_TIMEOUT_S)
            delivered.append(message.payload[0][1])
            message.ack()
        queue.close()
    assert delivered == ["taken-back", "new-1", "new-2"]
