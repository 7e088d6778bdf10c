"""`status` tells where each suspect of poison stands and by when the run has their verdicts, from a real
redis-server: the prompt on trial alone and for how long, the one waiting for its trial and until when,
one suspected once, each one's convictions so far; a prompt already committed, or acquitted, is not a
suspect; and the line `wait` prints says how many and by when."""

from __future__ import annotations

import io
import time
from collections.abc import Sequence

import redis
from rich.console import Console

from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from producer.enqueue.enqueuer import Enqueuer, pin_settings
from producer.status.gather import gather_status
from producer.status.view import render_status, status_line
from tests.support.records import prompt
from workers.state.heartbeats import TrialPlan, WorkerHeartbeat, encode_heartbeat
from workers.state.keys import RunKeys, worker_heartbeat_key
from workers.state.ledger import RunLedger
from workers.state.poison import Suspicion, TrialBegun, TrialEnd

RUN = "suspects"
GPU0, GPU1 = "node-a/gpu0", "node-a/gpu1"
ON_TRIAL_FOR_S = 40.0
NEXT_TRIAL_IN_S = 200.0
CONTROL_S = 200.0
WIDE_CONSOLE = 400  # one line a suspect, whatever the terminal
TRIAL_WITHIN_S = 300.0  # the workers' liveness stall window, their defaults
TIMING_FLOOR_S = 10.0


def enqueue(client: redis.Redis, prompt_ids: Sequence[str]) -> None:
    settings = RunSettings(
        run=RUN, sampling=SamplingSettings(), output="file:///tmp/x", batch_size=len(prompt_ids)
    )
    Enqueuer(client, pin_settings(client, settings), lambda _run, _ids: None, source="t").enqueue(
        prompt(i) for i in prompt_ids
    )


def suspected(ledger: RunLedger, prompt_id: str, times: int) -> None:
    for _ in range(times):
        ledger.strike(
            prompt_id, Suspicion(life=f"{GPU0}#a.1", cause="dropped", with_server=False, at=time.time())
        )


def tried(ledger: RunLedger, prompt_id: str, ending: TrialEnd) -> None:
    begun = TrialBegun(
        trial=f"{prompt_id}-{ending.name}",
        life=f"{GPU0}#a.2",
        started_at=time.time() - 600,
        canary_before_s=0.01,
        control_s=3600.0,
        mean_up_s=3600.0,
    )
    ledger.strike(prompt_id, begun)
    ledger.strike(prompt_id, begun.end(ending, failed_after_s=0.3, canary_after_s=2.0))


def heartbeat(client: redis.Redis, worker: str, plans: list[TrialPlan]) -> None:
    beat = WorkerHeartbeat(
        worker=worker,
        host="node-a",
        gpu=int(worker[-1]),
        server_url="http://127.0.0.1:30000",
        in_flight=0,
        max_in_flight=48,
        suspended=False,
        server_health=200,
        spec_accept_length=None,
        updated_at=time.time(),
        trials=plans,
        suspects=len(plans),
        trial_within_s=TRIAL_WITHIN_S,
        timing_floor_s=TIMING_FLOOR_S,
    )
    client.set(worker_heartbeat_key(worker), encode_heartbeat(beat), ex=60)


def test_status_tells_each_suspect_s_trial_its_convictions_and_by_when_the_run_has_every_verdict(
    redis_client: redis.Redis,
) -> None:
    # Given a run where one prompt is on trial alone (convicted once), one waits for its trial, one was
    # suspected once, one was acquitted alone, and one is committed though it was suspected
    enqueue(redis_client, ["on-trial", "waiting", "once", "acquitted", "committed"])
    ledger = RunLedger(redis_client, RUN)
    suspected(ledger, "on-trial", 2)
    tried(ledger, "on-trial", TrialEnd.DROPPED)
    suspected(ledger, "waiting", 2)
    suspected(ledger, "once", 1)
    suspected(ledger, "acquitted", 2)
    tried(ledger, "acquitted", TrialEnd.COMPLETED)
    suspected(ledger, "committed", 2)
    redis_client.sadd(RunKeys(RUN).done, "committed")
    now = time.time()
    on_trial = TrialPlan(
        run=RUN, prompt_id="on-trial", on_trial=True, since=now - ON_TRIAL_FOR_S, next_at=None, control_s=5.0
    )
    waiting = TrialPlan(
        run=RUN,
        prompt_id="waiting",
        on_trial=False,
        since=now,
        next_at=now + NEXT_TRIAL_IN_S,
        control_s=CONTROL_S,
    )
    heartbeat(redis_client, GPU0, [on_trial])
    heartbeat(redis_client, GPU1, [waiting])

    # When status reads the run
    status = gather_status(redis_client, RUN)

    # Then the three still to settle are its suspects, the one on trial first, then the one waiting
    assert status.suspects is not None
    assert [s.prompt_id for s in status.suspects.suspects] == ["on-trial", "waiting", "once"]
    assert status.suspects.total == 3 and status.suspects.read_all
    assert [(s.suspicions, s.convictions) for s in status.suspects.suspects] == [(2, 1), (2, 0), (1, 0)]
    # and every verdict comes by, at the latest: the waiting one's start, then each one's trials in turn
    assert status.suspects.verdicts_by is not None
    assert status.suspects.verdicts_by >= status.now + NEXT_TRIAL_IN_S + 3 * TRIAL_WITHIN_S
    out = io.StringIO()
    Console(file=out, width=WIDE_CONSOLE, color_system=None).print(render_status(status))
    text = out.getvalue()
    assert f"on-trial: on trial alone on {GPU0} for 40 s; 1 of 3 convictions" in text
    assert f"waits for its trial alone on {GPU1}, by " in text
    assert "(in 3 min 2" in text or "(in 3 min 1" in text  # 200 s from when the heartbeat was written
    assert "once its server has worked 3 min 20 s without failing; 0 of 3 convictions" in text
    assert "once: suspected once; a second suspicion makes it a suspect, tried alone" in text
    assert "3 suspected: the run ends once each is committed or dead-lettered, every verdict by " in text
    assert "acquitted:" not in text and "committed:" not in text
    # And the line `wait` prints each minute says it too
    assert "; 3 suspected of poison, every verdict by " in status_line(status)


def test_a_run_without_suspects_shows_no_such_section(redis_client: redis.Redis) -> None:
    enqueue(redis_client, ["a", "b"])
    suspected(RunLedger(redis_client, RUN), "a", 1)
    redis_client.sadd(RunKeys(RUN).done, "a")
    status = gather_status(redis_client, RUN)
    assert status.suspects is None and "suspected of poison" not in status_line(status)
