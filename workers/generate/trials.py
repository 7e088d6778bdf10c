"""What a worker sees of its server for trials of suspected poison (the rule: workers/state/poison.py;
the suspicions and trials themselves: workers/generate/tribunal.py).

- `Steadiness`: the server's record as this worker saw it, the control a trial is compared with: the
  stretch since it last failed (a request got no answer, a canary went unanswered, the liveness watch
  suspended the engine or saw the server restarted) or came back, its mean time between failures, its
  lives. Trials and their failures are left out. A worker that starts knows nothing older than itself.
- `Court`: waits until the server shows the control a suspect needs (or cannot), asks canaries, and after
  a failed trial waits for the server to answer one again; `trial_end` and `failed_after_s` say how a
  trial ended and how fast (a wedge from when the liveness watch last saw progress, a silence from the
  suspect's last chunk, else the failure itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from core.records import SamplingSettings
from inference.errors import FailureCause, InferenceUnavailable
from inference.readiness import DEFAULT_READY_TIMEOUT_S
from workers.generate.liveness import DEFAULT_LIVENESS_POLL_S, DEFAULT_LIVENESS_STALL_S, Liveness, Outage
from workers.state.poison import Evidence, TrialEnd

log = logging.getLogger(__name__)

CONTROL_WAIT_FACTOR = 3.0
"""A suspect waits up to this many times the control it needs for its server to show it: a steady server
shows it even after a failure or two meanwhile. A server that cannot show it in that time (it fails too
often) gets the suspect at once: a trial the control does not back cannot convict, but it can acquit,
and no suspect waits for ever."""
COMEBACK_CANARY_INTERVAL_S = 2.0
"""After a failure, how often the server is asked a canary while it is not suspended (a crash the
liveness watch has not called yet, a drop)."""

_LOST_CAUSES = frozenset(
    {FailureCause.DROPPED, FailureCause.TIMED_OUT, FailureCause.MALFORMED, FailureCause.REFUSED}
)


class Canary(Protocol):
    """`SilenceWatch.server_generates`: does the server answer a one-token generation now."""

    async def __call__(self, sampling: SamplingSettings, *, why: str) -> bool: ...


WEDGE_TIMING_POLLS = 2
"""A wedge is timed by the liveness watch's last poll that saw progress: the first poll after a trial
began may still see the work done before it, and a poll on a busy machine comes late. Two polls cover
both, so that a trial waiting for the control of a failure that fast is not voided by the timing's jitter."""


@dataclass(frozen=True)
class TrialSettings:
    silence_limit_s: float = DEFAULT_LIVENESS_STALL_S
    """A lone suspect's silence is judged with the liveness watch's own stall window, not the silence
    limit: a long prefill alone, or an idle proxy, must not convict."""
    timing_floor_s: float = WEDGE_TIMING_POLLS * DEFAULT_LIVENESS_POLL_S
    """How fast a wedge may seem to fail, as timed: the first trial of a suspect assumes it fails no
    faster than this, so that the control shown before it suffices."""
    comeback_limit_s: float = DEFAULT_READY_TIMEOUT_S
    """A server that answers no canary this long after a trial failed was broken: the trial is void."""

    @classmethod
    def for_liveness(cls, *, stall_s: float, poll_s: float) -> TrialSettings:
        """Trials judged by the liveness watch's own stall window and timed by its polls."""
        return cls(silence_limit_s=stall_s, timing_floor_s=WEDGE_TIMING_POLLS * poll_s)


class Ruling(enum.Enum):
    """Whether the server came back after a failed trial."""

    BACK = "back"
    NEVER_BACK = "never back"
    GIVEN_UP = "given up"  # the worker stopped or lost the batch meanwhile


@dataclass
class Steadiness:
    """How this worker's server has held up: since when it has worked without failing (the stretch), its
    mean time between failures, and which of its lives it is in. Times are the engine loop's clock.

    One outage is one failure, however many requests it took down (`down` until the server is back). A
    failed trial is the suspect's doing if it is poison: neither its time nor its failure counts, so that
    the server's record without the suspect is what a conviction is compared with.
    """

    since: float  # the stretch began: the worker started, or the server last failed or came back
    up_s: float = 0.0  # the stretches that ended in a failure, trials left out
    failures: int = 0
    lives: int = 0
    down: bool = False  # failed and not back yet
    served_in_life: bool = True  # a request was answered since the last life began
    trial_since: float | None = None  # a suspect holds the server alone since then

    def failed(self, now: float, *, server_down: bool) -> None:
        """A request got no answer, or the server went down (its life ends, once per life)."""
        if self.trial_since is None:
            if not self.down:
                self.up_s += max(0.0, now - self.since)
                self.failures += 1
            self.since = now
        if server_down:
            self._went_down()

    def _went_down(self) -> None:
        self.down = True
        if self.served_in_life:
            self.lives += 1
            self.served_in_life = False

    def restarted(self, at: float) -> None:
        """The server started again at `at` behind the worker's back: a failure, and its new life the
        stretch; nothing new if the worker saw it back since (its stretch began after `at`)."""
        if at <= self.since and not self.down:
            return
        self.failed(at, server_down=True)
        self.back(at)

    def back(self, now: float) -> None:
        """The server answers again: a new stretch begins (the outage is no work)."""
        if self.down:
            self.down = False
            self.since = max(self.since, now)

    def served(self, now: float) -> None:
        self.back(now)
        self.served_in_life = True

    def trial_began(self, now: float) -> None:
        self.trial_since = now

    def trial_failed(self, now: float, *, server_down: bool) -> None:
        """The stretch before the trial was ordinary work; the trial and its failure are left out."""
        began = self.trial_since if self.trial_since is not None else now
        self.trial_since = None
        self.up_s += max(0.0, began - self.since)
        self.since = now
        if server_down:
            self._went_down()

    def trial_completed(self) -> None:
        self.trial_since = None

    def control_s(self, now: float) -> float:
        return 0.0 if self.down else max(0.0, now - self.since)

    def mean_up_s(self, now: float) -> float:
        """Work per failure, the stretch under way included; one failure more than seen, so that a server
        watched only briefly is not taken for a steady one."""
        return (self.up_s + self.control_s(now)) / (self.failures + 1)

    def short_of_s(self, now: float, needed_s: float) -> float:
        """How much longer the server must work without failing until both its stretch and its mean time
        between failures reach `needed_s`."""
        stretch_s = self.control_s(now)
        return max(0.0, needed_s - stretch_s, needed_s * (self.failures + 1) - self.up_s - stretch_s)


class ProvenPoison(Exception):
    """The prompt's record now dead-letters it (the engine's attempt loop catches it)."""

    def __init__(self, evidence: list[Evidence]) -> None:
        super().__init__("proven poison")
        self.evidence = evidence


class AbandonedInFlight(InferenceUnavailable):
    """A request sent and given up by the engine: the liveness watch suspended it (`outage`), or the
    worker is stopping (no outage)."""

    def __init__(self, reason: str, outage: Outage | None) -> None:
        super().__init__(f"abandoned: {reason}", cause=FailureCause.ABANDONED)
        self.outage = outage


def trial_end(error: InferenceUnavailable, *, server_answers: bool) -> TrialEnd:
    """How a trial ended, from its request's failure and whether the server answered a canary just after."""
    if isinstance(error, AbandonedInFlight):
        if error.outage is None:
            return TrialEnd.GIVEN_UP
        return TrialEnd.WEDGED if error.outage.state == Liveness.HUNG.value else TrialEnd.WENT_DOWN
    if error.cause is FailureCause.SILENT:
        return TrialEnd.SILENT
    if error.cause in _LOST_CAUSES:
        return TrialEnd.DROPPED if server_answers else TrialEnd.WENT_DOWN
    return TrialEnd.GIVEN_UP  # an error status: the server answered, not a failure to answer


def failed_after_s(
    error: InferenceUnavailable, *, started: float, last_sign: float, failed_at: float
) -> float:
    """How long into the trial the suspect failed: when the liveness watch last saw the server make
    progress (a wedge), the suspect's last chunk (silence), or the failure itself (a lost connection)."""
    if isinstance(error, AbandonedInFlight) and error.outage is not None:
        stalled = error.outage.stalled_since
        return max(0.0, (stalled if stalled is not None else last_sign) - started)
    if error.cause is FailureCause.SILENT:
        return max(0.0, last_sign - started)
    return max(0.0, failed_at - started)


class Court:
    """The timing side of trials, on the engine's event loop."""

    def __init__(
        self,
        settings: TrialSettings,
        steadiness: Steadiness,
        canary: Canary,
        *,
        suspended: Callable[[], bool],
        resumed: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.steadiness = steadiness
        self._canary = canary
        self._suspended = suspended
        self._resumed = resumed

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    async def canary(self, sampling: SamplingSettings, why: str) -> bool:
        answered = await self._canary(sampling, why=why)
        if answered:
            self.steadiness.served(self.now())
        else:
            self.steadiness.failed(self.now(), server_down=True)
        return answered

    def control_wait_until(self, needed_s: float) -> float:
        return self.now() + CONTROL_WAIT_FACTOR * needed_s

    def may_try(self, needed_s: float, until: float) -> bool:
        """Whether a suspect may be tried now: its server shows the control it needs, or cannot before
        `until` (it fails too often, or the wait is over)."""
        return self._wait_s(needed_s, until) == 0

    def _wait_s(self, needed_s: float, until: float) -> float:
        now = self.now()
        short_s = self.steadiness.short_of_s(now, needed_s)
        if short_s <= 0 or now >= until or (not self.steadiness.down and now + short_s > until):
            return 0.0
        return min(short_s, until - now)

    async def await_control(
        self, needed_s: float, until: float, gave_up: Callable[[], str | None], sampling: SamplingSettings
    ) -> None:
        """Return once `may_try`; raise InferenceUnavailable (ABANDONED) when the worker gives the batch up
        first. A server seen down is asked a canary now and then."""
        while True:
            reason = gave_up()
            if reason is not None:
                raise InferenceUnavailable(f"not tried: {reason}", cause=FailureCause.ABANDONED)
            if self.steadiness.down and not self._suspended():
                await self.canary(sampling, "is the server back, for a trial")
            wait_s = self._wait_s(needed_s, until)
            if wait_s == 0:
                return
            await asyncio.sleep(min(wait_s, COMEBACK_CANARY_INTERVAL_S))

    async def comeback(
        self, sampling: SamplingSettings, failed_at: float, gave_up: Callable[[], str | None], why: str
    ) -> tuple[Ruling, float]:
        """Wait until the server answers a canary again (after the liveness watch resumed the engine, if
        it suspended it); the ruling and how long after `failed_at` it answered."""
        deadline = failed_at + self.settings.comeback_limit_s
        while True:
            if gave_up() is not None:
                return Ruling.GIVEN_UP, math.nan
            remaining_s = deadline - self.now()
            if remaining_s <= 0:
                return Ruling.NEVER_BACK, math.nan
            if self._suspended():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._resumed.wait(), min(remaining_s, COMEBACK_CANARY_INTERVAL_S))
                continue
            if await self.canary(sampling, why):
                return Ruling.BACK, self.now() - failed_at
            await asyncio.sleep(min(remaining_s, COMEBACK_CANARY_INTERVAL_S))
