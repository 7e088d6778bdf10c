"""Suspects of poison on a worker's engine: what a failed request tells against its prompt (a suspicion),
and a suspect's trial alone. The rule is workers/state/poison.py's; timing and the server's record are
workers/generate/trials.py's; the engine (workers/generate/generation.py) holds the slots and sends.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from core.records import SamplingSettings
from inference.chat_stream import ChatResult
from inference.errors import FailureCause, InferenceRejected, InferenceUnavailable
from workers.generate.silence import SilenceWatch
from workers.generate.trials import (
    AbandonedInFlight,
    Court,
    ProvenPoison,
    Ruling,
    failed_after_s,
    retimed,
    trial_end,
)
from workers.state.heartbeats import TrialPlan
from workers.state.poison import (
    Evidence,
    PoisonPolicy,
    Suspicion,
    TrialBegun,
    TrialEnd,
    Verdict,
)

log = logging.getLogger(__name__)

QUEUED_ALONE_S = 1.0
"""A suspect that waited longer than this for the server alone (behind other suspects' trials, or the
drain of long requests) is tried only on the control its server shows then."""

SUSPICIOUS_CAUSES = frozenset(
    {FailureCause.SILENT, FailureCause.DROPPED, FailureCause.TIMED_OUT, FailureCause.MALFORMED}
)
"""Failures of a request the server received and did not answer, beside those the liveness watch gave up
(AbandonedInFlight with an outage): a prompt's suspicions. Refused connections, HTTP errors (retried, then
dead-lettered as `failed_every_attempt`) and requests the worker gave up are not."""


class Strikes(Protocol):
    """Where poison records are kept (the run's ledger, across workers)."""

    def strike(self, prompt_id: str, event: Evidence) -> list[Evidence]: ...


class Case(Protocol):
    """What a suspect's trial needs of the batch at work (the engine's job)."""

    run: str
    sampling: SamplingSettings
    suspects: set[str]  # prompts tried alone
    evidence: dict[str, list[Evidence]]  # their records, as last read

    @property
    def handover(self) -> Strikes: ...
    def mark_sent(self, prompt_id: str) -> None: ...


Send = Callable[[SilenceWatch, list[float]], Awaitable[ChatResult]]
"""Sends the suspect's request, guarded by the watch given, appending the time of each of its chunks."""
Reason = Callable[[], str | None]


@dataclass
class Tribunal:
    policy: PoisonPolicy
    court: Court
    trial_silence: SilenceWatch  # a lone suspect's silence, judged with the liveness stall window
    in_thread: Callable[..., Awaitable[Any]]  # a blocking call to the run's state, on the engine's threads
    life: Callable[[], str]  # the server's life as the strikes name it
    alone: Callable[[], AbstractAsyncContextManager[None]]  # the whole server: nothing else in flight
    plans: dict[tuple[str, str], TrialPlan] = field(default_factory=dict)  # by (run, prompt): for status

    def trial_plans(self) -> tuple[TrialPlan, ...]:
        """The suspects this worker holds, on trial first, then by when their trials begin (any thread)."""
        plans = list(self.plans.values())
        return tuple(sorted(plans, key=lambda plan: (not plan.on_trial, plan.next_at or 0.0)))

    def _plan(
        self, case: Case, prompt_id: str, *, since: float, needed_s: float, starts_by: float | None
    ) -> None:
        """Note where the suspect stands; `starts_by` on the loop's clock (None: on trial now)."""
        next_at = None if starts_by is None else time.time() + max(0.0, starts_by - self.court.now())
        self.plans[(case.run, prompt_id)] = TrialPlan(
            run=case.run,
            prompt_id=prompt_id,
            on_trial=starts_by is None,
            since=since,
            next_at=next_at,
            control_s=round(needed_s, 1),
        )

    async def suspect(self, case: Case, prompt_id: str, error: InferenceUnavailable) -> Verdict | None:
        """Record a failure of the prompt's request where the server may be to blame: with the server
        (it went down, or the liveness watch gave the request up) or on its own (cut for silence, or its
        connection lost while the server still answers). Never a conviction; it may make a suspect. The
        verdict on the prompt's record as every worker left it; None when the failure tells nothing."""
        court, steadiness = self.court, self.court.steadiness
        if isinstance(error, AbandonedInFlight):
            if error.outage is None:
                return None  # the worker gave it up: nothing happened to the server
            with_server, cause = True, error.outage.state
        elif error.cause in SUSPICIOUS_CAUSES:
            with_server = error.cause is not FailureCause.SILENT and not await court.canary(
                case.sampling, f"prompt {prompt_id}: {error}"
            )
            cause = error.cause.value
        else:
            if error.cause is FailureCause.REFUSED:
                steadiness.failed(court.now(), server_down=True)
            return None
        steadiness.failed(court.now(), server_down=with_server)
        event = Suspicion(life=self.life(), cause=cause, with_server=with_server, at=time.time())
        evidence = await self._strike(case, prompt_id, event)
        case.evidence[prompt_id] = evidence
        verdict = self.policy.judge(evidence)
        if verdict is Verdict.TRIAL and prompt_id not in case.suspects:
            log.warning("prompt %s is a suspect of poison: it will be tried alone", prompt_id)
            case.suspects.add(prompt_id)
        return verdict

    async def trial(
        self, case: Case, prompt_id: str, send: Send, *, stop_reason: Reason, given_up: Reason
    ) -> ChatResult:
        """Try a suspect alone: once the server has shown the control the suspect needs, hold it alone,
        ask a canary, send the suspect, and on a failure wait (still alone) for the server to answer a
        canary again. Every trial is recorded (begun, then ended); raises ProvenPoison once the record
        dead-letters the prompt, else the request's error. `stop_reason`: why nothing may be sent now
        (a suspension included); `given_up`: why the worker gives the prompt up (stopping, lease lost)."""
        court = self.court
        needed_s = self.policy.control_before_trial_s(
            case.evidence.get(prompt_id, []), court.settings.timing_floor_s
        )
        case.mark_sent(prompt_id)  # waiting for its trial: the message need not wait with it
        until = court.control_wait_until(needed_s)
        since = time.time()

        def waiting(starts_by: float) -> None:
            self._plan(case, prompt_id, since=since, needed_s=needed_s, starts_by=starts_by)

        try:
            while True:
                await court.await_control(needed_s, until, stop_reason, case.sampling, waiting=waiting)
                asked = court.now()
                async with self.alone():
                    if court.now() - asked > QUEUED_ALONE_S and not court.shows(needed_s):
                        # other suspects' trials went first: the server's stretch starts anew after a failed
                        # one, and this one's wait ran on meanwhile; it waits for its control afresh
                        until = court.control_wait_until(needed_s)
                        continue
                    if court.may_try(needed_s, until):
                        self._plan(case, prompt_id, since=time.time(), needed_s=needed_s, starts_by=None)
                        return await self._try_alone(case, prompt_id, send, needed_s, stop_reason, given_up)
                    # a failure during the drain: wait for the control again, letting other work in
        finally:
            self.plans.pop((case.run, prompt_id), None)

    async def _try_alone(
        self, case: Case, prompt_id: str, send: Send, needed_s: float, stop_reason: Reason, given_up: Reason
    ) -> ChatResult:
        court, steadiness = self.court, self.court.steadiness
        reason = stop_reason()
        if reason is not None:
            raise InferenceUnavailable(f"not tried: {reason}", cause=FailureCause.ABANDONED)
        if not await court.canary(case.sampling, f"before trying prompt {prompt_id} alone"):
            raise InferenceUnavailable(
                "not tried: the server did not answer a one-token canary", cause=FailureCause.REFUSED
            )
        canary_at = court.now()
        control_s, mean_up_s = court.record(needed_s)
        begun = TrialBegun(
            trial=uuid.uuid4().hex[:12],
            life=self.life(),
            started_at=time.time(),
            canary_before_s=0.0,
            control_s=round(control_s, 3),
            mean_up_s=round(mean_up_s, 3),
        )
        await self._strike(case, prompt_id, begun)
        started = court.now()
        begun = msgspec.structs.replace(begun, canary_before_s=round(started - canary_at, 3))
        steadiness.trial_began(started)
        log.warning(
            "prompt %s: tried alone (%.0f s without failing, %.0f s between failures)",
            prompt_id,
            begun.control_s,
            begun.mean_up_s,
        )
        signs = [started]  # the suspect's last sign of life: its send, then each chunk
        try:
            result = await send(self.trial_silence, signs)
        except (InferenceRejected, InferenceUnavailable) as error:
            await self._failed(
                case, prompt_id, begun, error, started=started, last_sign=signs[-1], given_up=given_up
            )
            raise
        steadiness.trial_completed()  # served: the engine notes it with the result, as for any answer
        await self._strike(case, prompt_id, begun.end(TrialEnd.COMPLETED))
        case.suspects.discard(prompt_id)
        log.warning("prompt %s: acquitted, it completed alone", prompt_id)
        return result

    async def _failed(
        self,
        case: Case,
        prompt_id: str,
        begun: TrialBegun,
        error: InferenceRejected | InferenceUnavailable,
        *,
        started: float,
        last_sign: float,
        given_up: Reason,
    ) -> None:
        """Record how the trial ended; raise ProvenPoison when that makes the record dead-letter it."""
        court, steadiness = self.court, self.court.steadiness
        failed_at = court.now()
        if isinstance(error, InferenceRejected):
            ending, note, took_s = TrialEnd.GIVEN_UP, str(error), 0.0
        else:
            answers = (
                error.cause is not FailureCause.ABANDONED
                and error.cause is not FailureCause.SILENT
                and await court.canary(case.sampling, f"prompt {prompt_id} alone: {error}")
            )
            ending, note = trial_end(error, server_answers=answers), str(error)
            took_s = failed_after_s(error, ending, started=started, last_sign=last_sign, failed_at=failed_at)
        ruling, back_s = Ruling.GIVEN_UP, math.nan
        if ending is TrialEnd.GIVEN_UP:
            steadiness.trial_completed()  # an answer (an error status) or the worker's doing
        else:
            steadiness.trial_failed(failed_at, server_down=ending in (TrialEnd.WENT_DOWN, TrialEnd.WEDGED))
            ruling, back_s = await court.comeback(
                case.sampling, failed_at, given_up, f"after prompt {prompt_id} failed alone"
            )
            ending, took_s = retimed(ending, took_s, court.outage_seen, started=started)
            if ruling is not Ruling.BACK:
                note = f"{note}; {ruling.value}"
        ended = begun.end(
            TrialEnd.GIVEN_UP if ruling is Ruling.GIVEN_UP else ending,
            failed_after_s=took_s,
            canary_after_s=back_s if ruling is Ruling.BACK else None,
            note=note,
        )
        evidence = await self._strike(case, prompt_id, ended)
        case.evidence[prompt_id] = evidence
        outcome = self.policy.outcome(ended)
        log.warning("prompt %s: its trial alone is %s: %s", prompt_id, outcome.value, self.policy.why(ended))
        if self.policy.judge(evidence) is Verdict.DEAD:
            raise ProvenPoison(evidence)

    async def _strike(self, case: Case, prompt_id: str, event: Evidence) -> list[Evidence]:
        """Add the event to the prompt's record (on the engine's hand-over threads); the whole record."""
        evidence: list[Evidence] = await self.in_thread(case.handover.strike, prompt_id, event)
        return evidence
