"""Prompts suspected of poison that a run waits on (`status`, "Suspected poison"): each one's suspicions and
convictions so far, whether it is on trial alone or waiting for its trial and until when (from the
heartbeat of the worker holding it), and by when, at the latest, the run has every verdict
(docs/exactly-once.md, "Every run ends").

The timing is the workers' own, from their heartbeats: how long a lone suspect may run before its silence
or wedge is judged (the liveness stall window), and how finely a wedge is timed. With no live worker, no
trial is under way and none is foreseen: the verdicts wait for one. Every value comes from Redis, written
by nodes: a poison record is decoded with its bound (a line not ours is no evidence), a heartbeat with
its own; at most SUSPECT_RECORDS_READ records are read, so that a run that suspected many prompts over
its life costs `status` a bounded read.
"""

from __future__ import annotations

import redis

from core.records import Record
from workers.state.heartbeats import TrialPlan, WorkerHeartbeat
from workers.state.keys import RunKeys
from workers.state.poison import (
    CONTROL_WAIT_FACTOR,
    Outcome,
    PoisonPolicy,
    Suspicion,
    TrialEnded,
    Verdict,
    decode_evidence,
    since_acquittal,
)

SUSPECT_RECORDS_READ = 500
SUSPECTS_SHOWN = 10
HSCAN_COUNT = 100


class TrialTiming(Record, frozen=True):
    """The live workers' trial timing, the slowest of each (from their heartbeats)."""

    within_s: float  # a lone suspect's silence or wedge is judged within this: a trial's longest
    timing_floor_s: float  # a first trial waits for the control of a failure this fast


def trial_timing(heartbeats: list[WorkerHeartbeat]) -> TrialTiming | None:
    """None when no live worker says (none runs, or an older draftgen)."""
    within = [beat.trial_within_s for beat in heartbeats if beat.trial_within_s is not None]
    floors = [beat.timing_floor_s for beat in heartbeats if beat.timing_floor_s is not None]
    if not within or not floors:
        return None
    return TrialTiming(within_s=max(within), timing_floor_s=max(floors))


class Suspect(Record, frozen=True):
    prompt_id: str
    suspicions: int  # since its last acquittal
    convictions: int
    on_trial: bool
    worker: str | None  # the GPU whose worker holds it now; None: none says so (queued, or in company)
    since: float | None  # unix seconds: on trial, or waiting for it, since then
    next_at: float | None  # unix seconds: its next trial begins by then at the latest
    control_s: float  # the failure-free work its server must show before its next trial


class SuspectFigures(Record, frozen=True):
    suspects: list[Suspect]  # on trial first, then the soonest tried; SUSPECTS_SHOWN at most
    total: int  # prompts still to settle whose record makes them suspects or suspected, among those read
    read_all: bool  # every poison record of the run was read
    verdicts_by: float | None  # unix seconds: every verdict by then at the latest; None: no live worker
    convictions_to_dead: int


def read_suspects(
    client: redis.Redis, run: str, heartbeats: list[WorkerHeartbeat], now: float, policy: PoisonPolicy
) -> SuspectFigures | None:
    """The run's suspects still to settle, or None when it has none."""
    keys = RunKeys(run)
    records: dict[str, bytes] = {}
    for field, raw in client.hscan_iter(keys.strikes, count=HSCAN_COUNT):
        records[field.decode(errors="replace")] = raw
        if len(records) >= SUSPECT_RECORDS_READ:
            break
    read_all = len(records) < SUSPECT_RECORDS_READ
    unsettled = _unsettled(client, keys, list(records))
    timing = trial_timing(heartbeats)
    plans = {
        plan.prompt_id: (beat.worker, plan) for beat in heartbeats for plan in beat.trials if plan.run == run
    }
    suspects = [
        suspect
        for prompt_id in unsettled
        if (suspect := _suspect(prompt_id, records[prompt_id], plans.get(prompt_id), policy, timing))
        is not None
    ]
    if not suspects:
        return None
    suspects.sort(key=lambda s: (not s.on_trial, s.next_at is None, s.next_at or 0.0, -s.convictions))
    return SuspectFigures(
        suspects=suspects[:SUSPECTS_SHOWN],
        total=len(suspects),
        read_all=read_all,
        verdicts_by=None if timing is None else verdicts_by(suspects, now, policy, timing),
        convictions_to_dead=policy.convictions_to_dead,
    )


def verdicts_by(suspects: list[Suspect], now: float, policy: PoisonPolicy, timing: TrialTiming) -> float:
    """Every verdict by then at the latest, once faults stop: the suspects one after the other on one GPU,
    each trial its wait for the control (at most CONTROL_WAIT_FACTOR times it) and the trial itself, as
    many trials as a conviction of each still needs (an ordinary prompt is acquitted at its first)."""
    total_s = 0.0
    for suspect in suspects:
        trials = policy.convictions_to_dead - suspect.convictions
        first_wait_s = CONTROL_WAIT_FACTOR * suspect.control_s
        if suspect.next_at is not None:
            first_wait_s = max(0.0, suspect.next_at - now)
        later_waits_s = (trials - 1) * CONTROL_WAIT_FACTOR * suspect.control_s
        total_s += first_wait_s + trials * timing.within_s + later_waits_s
    return now + total_s


def _unsettled(client: redis.Redis, keys: RunKeys, prompt_ids: list[str]) -> list[str]:
    """Of these prompts, those neither done, staged nor dead."""
    if not prompt_ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        pipe.smismember(keys.done, prompt_ids)
        pipe.hmget(keys.staged, prompt_ids)
        pipe.hmget(keys.dead, prompt_ids)
        done, staged, dead = pipe.execute()
    return [
        prompt_id
        for prompt_id, is_done, stage, letter in zip(prompt_ids, done, staged, dead, strict=True)
        if not is_done and stage is None and letter is None
    ]


def _suspect(
    prompt_id: str,
    raw: bytes,
    held: tuple[str, TrialPlan] | None,
    policy: PoisonPolicy,
    timing: TrialTiming | None,
) -> Suspect | None:
    evidence = decode_evidence(raw, prompt_id)
    current = since_acquittal(evidence, policy)
    suspicions = sum(1 for e in current if isinstance(e, Suspicion))
    convictions = sum(
        1 for e in current if isinstance(e, TrialEnded) and policy.outcome(e) is Outcome.CONVICTED
    )
    if not suspicions and not convictions and policy.judge(current) is Verdict.AS_USUAL:
        return None
    worker, plan = held if held is not None else (None, None)
    return Suspect(
        prompt_id=prompt_id,
        suspicions=suspicions,
        convictions=convictions,
        on_trial=plan is not None and plan.on_trial,
        worker=worker,
        since=plan.since if plan is not None else None,
        next_at=plan.next_at if plan is not None else None,
        control_s=(
            plan.control_s
            if plan is not None
            else policy.control_before_trial_s(evidence, timing.timing_floor_s if timing else 0.0)
        ),
    )
