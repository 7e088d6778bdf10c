"""A worker that died holding batches is recorded against their prompts by the worker that takes its seat, on
a real redis-server, before the batches are dispatched again: each prompt still to generate is suspected,
and a trial alone that the dead worker left open is closed as `killed`, timed up to now. A prompt already
staged, another GPU's batches and another life's open trials are left as they were."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import redis

from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from producer.enqueue.enqueuer import Enqueuer, pin_settings
from tests.support.dispatch import RecordingDispatcher
from tests.support.records import completion, prompt
from workers.generate.deaths import KILLED_NOTE, record_deaths
from workers.recovery.leases import LeaseKeeper
from workers.recovery.reconciler import Reconciler, ReconcileSettings, TakenBack
from workers.recovery.seat import Seat
from workers.state.ledger import RunLedger, server_identity
from workers.state.poison import WORKER_DIED, Suspicion, TrialBegun, TrialEnd, TrialEnded

pytestmark = pytest.mark.integration

RUN = "deaths"
LABEL = "node-a/gpu0"
LONG_S = 3600.0
TRIAL_BEGAN_AGO_S = 20.0
CLOCK_MARGIN_S = 1.0  # between the two clocks read for one moment, on a busy machine


def one_batch(client: redis.Redis, prompt_ids: Sequence[str]) -> str:
    published: list[str] = []

    def publish(_run: str, batch_ids: Sequence[str]) -> None:
        published.extend(batch_ids)

    settings = RunSettings(
        run=RUN, sampling=SamplingSettings(), output="file:///tmp/x", batch_size=len(prompt_ids)
    )
    Enqueuer(client, pin_settings(client, settings), publish, source="test").enqueue(
        prompt(i) for i in prompt_ids
    )
    (batch_id,) = published
    return batch_id


def begun(life: str, trial: str) -> TrialBegun:
    return TrialBegun(
        trial=trial,
        life=life,
        started_at=time.time() - TRIAL_BEGAN_AGO_S,
        canary_before_s=0.01,
        control_s=LONG_S,
        mean_up_s=LONG_S,
    )


def never_lost(reason: str) -> None:
    raise AssertionError(f"the seat was lost: {reason}")


def test_a_successor_records_its_dead_predecessor_against_the_prompts_it_held_before_dispatching_them(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # Given a batch held by a worker that died: one prompt already staged, one on trial alone when it died
    # (and an older trial of another server's life, never ended), one not sent yet
    batch_id = one_batch(redis_client, ["staged", "on-trial", "waiting"])
    ledger = RunLedger(redis_client, RUN)
    ledger.stage(completion("staged"))
    predecessor = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    predecessor.take()
    LeaseKeeper(redis_client, worker=LABEL, seat=predecessor.token, ttl_s=LONG_S).acquire(RUN, batch_id)
    elsewhere = begun("node-b/gpu0#0123abcd.1", "elsewhere")
    ledger.strike("on-trial", elsewhere)
    ledger.strike("on-trial", begun(f"{LABEL}#{server_identity(predecessor.token)}.3", "its-last"))
    written = time.monotonic()
    predecessor._keeper.stop()  # SIGKILL: nothing of it runs again, and its subscription goes
    predecessor._pubsub.connection.disconnect()  # type: ignore[union-attr]

    # When the worker restarted on its GPU takes the seat and the batches back
    dispatcher = RecordingDispatcher()
    recorded_before_dispatch: list[int] = []

    def record(run: str, batches: list[TakenBack]) -> None:
        assert dispatcher.generated == []
        recorded_before_dispatch.append(record_deaths(redis_client, run, batches, label=LABEL))

    successor = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    reconciler = Reconciler(redis_client, dispatcher, ReconcileSettings(upload_max_age_s=LONG_S))
    try:
        assert reconciler.take_back_seat(successor.take(), LABEL, before_dispatch=record) == 1
    finally:
        successor.release()
    since_written_s = (
        time.monotonic() - written
    )  # the seat waits for its dead holder to be silent long enough

    # Then both prompts still to generate are suspected for the death, before the batch went out again
    assert recorded_before_dispatch == [2] and dispatcher.generated == [(RUN, batch_id)]
    records = ledger.strikes_of(["staged", "on-trial", "waiting"])
    assert "staged" not in records
    (waiting,) = records["waiting"]
    assert isinstance(waiting, Suspicion) and waiting.cause == WORKER_DIED and waiting.with_server
    # And the trial its predecessor left open is closed as killed, timed up to now; the other life's is not
    on_trial = records["on-trial"]
    assert [type(e) for e in on_trial] == [TrialBegun, TrialBegun, TrialEnded, Suspicion]
    killed = on_trial[2]
    assert isinstance(killed, TrialEnded) and killed.trial == "its-last" and killed.ended is TrialEnd.KILLED
    assert TRIAL_BEGAN_AGO_S <= killed.failed_after_s <= TRIAL_BEGAN_AGO_S + since_written_s + CLOCK_MARGIN_S
    assert killed.note == KILLED_NOTE


def test_a_clean_stop_leaves_nothing_against_the_prompts_its_worker_handed_back(
    redis_client: redis.Redis, redis_url: str
) -> None:
    # Given a worker that stopped cleanly: its lease released and its seat given up
    batch_id = one_batch(redis_client, ["a", "b"])
    first = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    first.take()
    keeper = LeaseKeeper(redis_client, worker=LABEL, seat=first.token, ttl_s=LONG_S)
    _acquired, lease = keeper.acquire(RUN, batch_id)
    keeper.release(lease, delay_s=0.0)
    first.release()
    # When the next worker takes the seat
    dispatcher = RecordingDispatcher()
    reconciler = Reconciler(redis_client, dispatcher, ReconcileSettings(upload_max_age_s=LONG_S))
    second = Seat(redis.Redis.from_url(redis_url), LABEL, on_lost=never_lost)
    taken = reconciler.take_back_seat(
        second.take(),
        LABEL,
        before_dispatch=lambda run, batches: record_deaths(redis_client, run, batches, label=LABEL),
    )
    # Then nothing was taken back, and no prompt is suspected
    assert taken == 0 and RunLedger(redis_client, RUN).strikes_of(["a", "b"]) == {}
    second.release()
