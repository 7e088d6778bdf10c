"""No lease outlives the execution that took it, on any exception path of a batch, the loss of the
protocol's function library included.

Each test takes a batch's lease as a GPU node's Redis user (deploy/redis-users.acl: it may call the
protocol's functions but not load them), makes the batch fail one way, and then asks whether another
execution can take the batch: a lease still held, and renewed by the keeper for as long as the worker
lives, would leave every later delivery of the batch "held" for good.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import redis

from core.records import Origin, Prompt, SamplingSettings
from core.run_settings.model import RunSettings
from producer.enqueue.enqueuer import Enqueuer, pin_settings
from tests.support.dispatch import RecordingDispatcher
from tests.support.records import completion, prompt
from tests.support.redis_head import GPU_NODES, RedisHead, node_user
from workers.context import WorkerContext
from workers.errors import FunctionsMissing, RetryLater
from workers.generate import batches
from workers.generate.batches import read_batch
from workers.generate.generation import BatchJob, BatchOutcome, Handover
from workers.recovery.leases import Acquired, LeaseKeeper
from workers.settings import WorkerSettings
from workers.state.keys import RunKeys
from workers.state.protocol import LIBRARY

pytestmark = pytest.mark.integration

RUN = "lease-leaks"
NODE = GPU_NODES[0]
LONG_S = 3600.0


def client_of(head: RedisHead, user: str) -> redis.Redis:
    return redis.Redis.from_url(head.urls[user])


@pytest.fixture
def producer(head: RedisHead, tmp_path: Path) -> Iterator[redis.Redis]:
    client = client_of(head, "producer")
    client_of(head, "admin").flushall()
    LIBRARY.load(client)
    yield client
    client.close()


@pytest.fixture
def context(head: RedisHead) -> Iterator[WorkerContext]:
    settings = WorkerSettings(redis_url=head.urls[node_user(NODE)], hostname=NODE, gpu=0)
    context = WorkerContext(settings)
    context.dispatcher = RecordingDispatcher()
    yield context
    context.close()


def enqueue_one_batch(producer: redis.Redis, tmp_path: Path, ids: list[str]) -> str:
    settings = RunSettings(
        run=RUN, sampling=SamplingSettings(), output=(tmp_path / "out").as_uri(), batch_size=len(ids)
    )
    pin_settings(producer, settings)
    published: list[str] = []
    Enqueuer(producer, settings, lambda _run, batch_ids: published.extend(batch_ids), source="t").enqueue(
        prompt(prompt_id) for prompt_id in ids
    )
    (batch_id,) = published
    return batch_id


def lose_the_function_library(admin: redis.Redis) -> None:
    admin.function_delete(LIBRARY.name)


def another_execution_takes(producer: redis.Redis, batch_id: str) -> Acquired:
    return LeaseKeeper(producer, worker="another/gpu0", ttl_s=LONG_S).acquire(RUN, batch_id)[0]


class StagingEngine:
    """The engine's face for one batch: it hands every prompt over at once through the worker's own
    ledger (so a missing function library fails the hand-over as it would mid-batch) and settles."""

    def __init__(self, before_hand_over: Callable[[], None]) -> None:
        self.origin = Origin(host=NODE, gpu=0, server_url="http://unused")
        self._before_hand_over = before_hand_over

    def submit_batch(
        self, run: str, prompts: list[Prompt], sampling: object, handover: Handover, *_: object, **__: object
    ) -> BatchJob:
        done: Future[BatchOutcome] = Future()
        self._before_hand_over()
        try:
            for one in prompts:
                handover.stage(completion(one.id))
        except Exception as error:  # the engine's future carries whatever the hand-over raised
            done.set_exception(error)
        else:
            done.set_result(BatchOutcome(staged=len(prompts)))
        sent = threading.Event()
        sent.set()
        return BatchJob(sent, done)

    def close(self) -> None: ...


class KnownServer:
    def __init__(self, origin: Origin) -> None:
        self._origin = origin

    def refresh(self) -> Origin:
        return self._origin


def test_a_batch_whose_hand_over_meets_no_function_library_hands_its_lease_back_once_it_is_loaded_again(
    head: RedisHead, producer: redis.Redis, context: WorkerContext, tmp_path: Path
) -> None:
    # Given a batch a generate worker is about to hand over, when the function library disappears
    batch_id = enqueue_one_batch(producer, tmp_path, ["p0", "p1"])
    admin = client_of(head, "admin")
    engine = StagingEngine(before_hand_over=lambda: lose_the_function_library(admin))
    context._engine = engine  # type: ignore[assignment]
    context._server_record = KnownServer(engine.origin)  # type: ignore[assignment]

    # When the task meets it, and the producer loads the library again before the worker's next renewal
    with pytest.raises(FunctionsMissing):
        batches.handle_generate(context, RUN, batch_id)
    LIBRARY.load(producer)
    context.leases.renew()

    # Then the batch is free for its next delivery: no lease of it is held, nor renewed
    assert another_execution_takes(producer, batch_id) is Acquired.ACQUIRED


def test_a_batch_tail_whose_hand_over_meets_no_function_library_hands_its_lease_back_once_it_is_loaded_again(
    head: RedisHead, producer: redis.Redis, context: WorkerContext, tmp_path: Path
) -> None:
    # Given a batch whose message was acknowledged and whose last prompts are still being generated
    batch_id = enqueue_one_batch(producer, tmp_path, ["p0", "p1"])
    _, lease = context.leases.acquire(RUN, batch_id)
    blob = producer.get(RunKeys(RUN).batch(batch_id))
    assert blob is not None
    batch = read_batch(producer, RUN, batch_id, blob, batch_size=2)
    assert batch is not None
    # When the function library disappears and the tail's hand-over meets it
    lose_the_function_library(client_of(head, "admin"))
    done: Future[BatchOutcome] = Future()
    try:
        context.leases.finish(lease, ["p0", "p1"])
    except RetryLater as error:
        done.set_exception(error)
    batches._settle_tail(context, lease, batch, 2, done)
    LIBRARY.load(producer)
    context.leases.renew()

    # Then the batch goes out again and is free for that delivery
    assert isinstance(context.dispatcher, RecordingDispatcher)
    assert context.dispatcher.generated == [(RUN, batch_id)]
    assert another_execution_takes(producer, batch_id) is Acquired.ACQUIRED
