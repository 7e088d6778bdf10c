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
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from core.records import SamplingSettings
from inference.errors import FailureCause, InferenceUnavailable
from inference.readiness import DEFAULT_READY_TIMEOUT_S
from workers.generate.liveness import DEFAULT_LIVENESS_POLL_S, DEFAULT_LIVENESS_STALL_S, Liveness, Outage
from workers.state.poison import CONTROL_WAIT_FACTOR, Evidence, TrialEnd

log = logging.getLogger(__name__)

COMEBACK_CANARY_INTERVAL_S = 2.0
"""After a failure, how often the server is asked a canary while it is not suspended (a crash the
liveness watch has not called yet, a drop)."""
CONTROL_CANARY_INTERVAL_S = 10.0
"""While a suspect waits for its control and nothing else of its worker is in flight (a run's last prompts),
the server is asked a one-token canary this often: the control is then a server that answered, not one
left idle, whose hang nobody would have seen. It costs a token every 10 s of a GPU with nothing else to do."""

_LOST_CAUSES = frozenset({FailureCause.DROPPED, FailureCause.MALFORMED, FailureCause.REFUSED})


def control_window_s(needed_s: float) -> float:
    """The span over which a server's mean time between failures is taken for a control of `needed_s`."""
    return CONTROL_WAIT_FACTOR * needed_s


def answers_awaited(suspects_waiting: int, *, server_down: bool, canary_out: bool) -> int:
    """What a worker's suspects wait for from its server, as work waiting on it: a canary out, and while the
    server is down (it failed, and has answered nothing since) each suspect waiting for it. Between two
    canaries nothing is in flight, yet the server owes an answer; the liveness watch counts it, or a wedge
    whose requests ran out of a timeout shorter than its stall window would look idle for ever."""
    return max(suspects_waiting if server_down else 0, 1 if canary_out else 0)


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


RECORD_MAX_ENTRIES = 512
"""Failures and stretches of work a worker remembers of its server; older ones are forgotten, and with them
everything before (the record then starts after them: less work known, never fewer failures)."""


@dataclass
class Steadiness:
    """How this worker's server has held up: since when it has worked without failing (the stretch), its
    failures and stretches of work, and which of its lives it is in. Times are the engine loop's clock.

    One outage is one failure, however many requests it took down (`down` until the server is back). A
    failed trial is the suspect's doing if it is poison: neither its time nor its failure counts, so that
    the server's record without the suspect is what a conviction is compared with. The mean time between
    failures is taken over a window (`mean_up_s`): a failure leaves the record once it is older than the
    window, so a server that failed often once, and no more since, shows its control again within a
    window of time (docs/exactly-once.md, "Every run ends").
    """

    since: float  # the stretch began: the worker started, or the server last failed or came back
    failures: int = 0  # every failure seen, for the logs; the record below keeps the recent ones
    lives: int = 0
    down: bool = False  # failed and not back yet
    served_in_life: bool = True  # a request was answered since the last life began
    trial_since: float | None = None  # a suspect holds the server alone since then
    known_since: float = -math.inf  # nothing is known of the server before this
    worked: deque[tuple[float, float]] = field(default_factory=deque)  # stretches ended, oldest first
    failed_at: deque[float] = field(default_factory=deque)  # each failure counted, oldest first

    def __post_init__(self) -> None:
        self.known_since = max(self.known_since, self.since)

    def failed(self, now: float, *, server_down: bool) -> None:
        """A request got no answer, or the server went down (its life ends, once per life)."""
        if self.trial_since is None:
            if not self.down:
                self._close_stretch(now)
                self.failed_at.append(now)
                self.failures += 1
                self._forget_beyond_bound()
            self.since = now
        if server_down:
            self._went_down()

    def _close_stretch(self, end: float) -> None:
        if end > self.since:
            self.worked.append((self.since, end))

    def _forget_beyond_bound(self) -> None:
        while len(self.failed_at) > RECORD_MAX_ENTRIES or len(self.worked) > RECORD_MAX_ENTRIES:
            if self.failed_at and (not self.worked or self.failed_at[0] <= self.worked[0][1]):
                self.known_since = max(self.known_since, self.failed_at.popleft())
            else:
                self.known_since = max(self.known_since, self.worked.popleft()[1])

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
        self._close_stretch(began)
        self._forget_beyond_bound()
        self.since = now
        if server_down:
            self._went_down()

    def trial_completed(self) -> None:
        self.trial_since = None

    def control_s(self, now: float) -> float:
        return 0.0 if self.down else max(0.0, now - self.since)

    def mean_up_s(self, now: float, over_s: float = math.inf) -> float:
        """Work per failure over the last `over_s` (all that is known when longer), the stretch under way
        included; one failure more than seen, so that a server watched only briefly is not taken for a
        steady one."""
        start = max(now - over_s, self.known_since)
        worked_s = 0.0
        for begin, end in reversed(self.worked):  # oldest first: the newest are those in the window
            if end <= start:
                break
            worked_s += max(0.0, min(end, now) - max(begin, start))
        if not self.down:
            worked_s += max(0.0, now - max(self.since, start))
        failures = 0
        for at in reversed(self.failed_at):
            if at <= start:
                break
            failures += at <= now
        return worked_s / (failures + 1)

    def shows(self, now: float, needed_s: float, over_s: float) -> bool:
        """Whether both the stretch and the mean time between failures over `over_s` reach `needed_s`."""
        return self.control_s(now) >= needed_s and self.mean_up_s(now, over_s) >= needed_s

    def ready_at(self, now: float, needed_s: float, over_s: float) -> float | None:
        """The earliest moment from `now` at which the server would show `needed_s` over `over_s` if it
        failed no more; None while it is down (it has to come back first). Never later than the stretch
        reaching `needed_s` once the last failure is `over_s` old (`over_s` is at least `needed_s`)."""
        if self.down:
            return None
        latest = max(self.since + needed_s, (self.failed_at[-1] + over_s) if self.failed_at else now, now)
        leaving: list[float] = []  # when each failure still in the window leaves it
        for at in reversed(self.failed_at):
            if at + over_s < now:
                break
            leaving.append(at + over_s)
        candidates = sorted(at for at in {now, self.since + needed_s, *leaving} if now <= at <= latest)
        return next((at for at in candidates if self.shows(at, needed_s, over_s)), latest)


def control_wait_s(steadiness: Steadiness, now: float, needed_s: float, until: float) -> float:
    """How much longer a suspect waits for its server to show `needed_s` of control (0: try it now): until
    it does, or `until`; at once when it cannot show it by then if it fails no more (it fails too often)."""
    if now >= until:
        return 0.0
    ready = steadiness.ready_at(now, needed_s, control_window_s(needed_s))
    if ready is None:  # down: it has to come back first
        return until - now
    if ready <= now or ready > until:
        return 0.0
    return ready - now


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
    """How a trial ended, from its request's failure and whether the server answered a canary just after.
    A request that ran out of the client's timeout got no chunk for that long: while the server answers,
    that is a silence, as the trial's own silence watch would have called it."""
    if isinstance(error, AbandonedInFlight):
        if error.outage is None:
            return TrialEnd.GIVEN_UP
        return TrialEnd.WEDGED if error.outage.state == Liveness.HUNG.value else TrialEnd.WENT_DOWN
    if error.cause is FailureCause.SILENT:
        return TrialEnd.SILENT
    if error.cause is FailureCause.TIMED_OUT:
        return TrialEnd.SILENT if server_answers else TrialEnd.WENT_DOWN
    if error.cause in _LOST_CAUSES:
        return TrialEnd.DROPPED if server_answers else TrialEnd.WENT_DOWN
    return TrialEnd.GIVEN_UP  # an error status: the server answered, not a failure to answer


def failed_after_s(
    error: InferenceUnavailable, ending: TrialEnd, *, started: float, last_sign: float, failed_at: float
) -> float:
    """How long into the trial the suspect failed: when the liveness watch last saw the server make
    progress (a wedge), the suspect's last chunk (a silence, or a timeout while the server answers), or
    the failure itself (a lost connection, a server gone down)."""
    if isinstance(error, AbandonedInFlight) and error.outage is not None:
        stalled = error.outage.stalled_since
        return max(0.0, (stalled if stalled is not None else last_sign) - started)
    if ending is TrialEnd.SILENT:
        return max(0.0, last_sign - started)
    return max(0.0, failed_at - started)


def retimed(
    ending: TrialEnd, took_s: float, outage: Outage | None, *, started: float
) -> tuple[TrialEnd, float]:
    """A trial whose request ran out of the client's timeout with the server gone silent (`went down`),
    timed to that timeout, once the liveness watch calls the server hung: a wedge, timed as the watch
    times it (when the server last made progress), not to a client timeout shorter than its window."""
    if ending is not TrialEnd.WENT_DOWN or outage is None or outage.state != Liveness.HUNG.value:
        return ending, took_s
    if outage.stalled_since is None:
        return ending, took_s
    return TrialEnd.WEDGED, min(took_s, max(0.0, outage.stalled_since - started))


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
        idle: Callable[[], bool] = lambda: False,
        outage: Callable[[], Outage | None] = lambda: None,  # the last outage the liveness watch declared
    ) -> None:
        self.settings = settings
        self.steadiness = steadiness
        self._canary = canary
        self._suspended = suspended
        self._resumed = resumed
        self._idle = idle
        self._outage = outage
        self._last_canary = -math.inf
        self._asking: asyncio.Future[bool] | None = None
        self._waiting = 0  # suspects in a wait for their control or for the server's comeback
        self.outage_seen: Outage | None = (
            None  # an outage the liveness watch declared during the last comeback
        )

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    async def canary(self, sampling: SamplingSettings, why: str) -> bool:
        """Whether the server answers a one-token canary now. Suspects that ask while a canary is out share
        its answer: a server that may be sick is asked one question at a time, however many wait on it."""
        while (out := self._asking) is not None:
            await asyncio.wait({out})  # the asker who sent it may give up: then the next one asks anew
            if not out.cancelled():
                return out.result()
        self._asking = asking = asyncio.get_running_loop().create_future()
        self._last_canary = self.now()
        try:
            answered = await self._canary(sampling, why=why)
        except BaseException:
            asking.cancel()  # the others ask again
            raise
        finally:
            self._asking = None
        if answered:
            self.steadiness.served(self.now())
        else:
            self.steadiness.failed(self.now(), server_down=True)
        asking.set_result(answered)
        return answered

    @property
    def awaiting_server(self) -> int:
        """The answers this court's suspects wait for from the server now (`answers_awaited`)."""
        canary_out = self._asking is not None
        return answers_awaited(self._waiting, server_down=self.steadiness.down, canary_out=canary_out)

    @contextlib.contextmanager
    def _waiting_on_server(self) -> Iterator[None]:
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1

    def control_wait_until(self, needed_s: float) -> float:
        return self.now() + CONTROL_WAIT_FACTOR * needed_s

    def record(self, needed_s: float) -> tuple[float, float]:
        """The server's control now, as a trial backed by `needed_s` records it: its stretch, and its mean
        time between failures over the control's window."""
        now = self.now()
        return self.steadiness.control_s(now), self.steadiness.mean_up_s(now, control_window_s(needed_s))

    def shows(self, needed_s: float) -> bool:
        """Whether the server shows `needed_s` of control now (its stretch and its mean over the window)."""
        return self.steadiness.shows(self.now(), needed_s, control_window_s(needed_s))

    def may_try(self, needed_s: float, until: float) -> bool:
        """Whether a suspect may be tried now: its server shows the control it needs, or cannot before
        `until` (it fails too often, or the wait is over)."""
        return self._wait_s(needed_s, until) == 0

    def _wait_s(self, needed_s: float, until: float) -> float:
        return control_wait_s(self.steadiness, self.now(), needed_s, until)

    async def await_control(
        self,
        needed_s: float,
        until: float,
        gave_up: Callable[[], str | None],
        sampling: SamplingSettings,
        *,
        waiting: Callable[[float], None] = lambda _starts_by: None,
    ) -> None:
        """Return once `may_try`; raise InferenceUnavailable (ABANDONED) when the worker gives the batch up
        first. A server seen down is asked a canary now and then, and an idle one too (the control).
        `waiting` is told, at each look, when the trial will begin at the latest if nothing fails."""
        with self._waiting_on_server():
            await self._await_control(needed_s, until, gave_up, sampling, waiting)

    async def _await_control(
        self,
        needed_s: float,
        until: float,
        gave_up: Callable[[], str | None],
        sampling: SamplingSettings,
        waiting: Callable[[float], None],
    ) -> None:
        while True:
            reason = gave_up()
            if reason is not None:
                raise InferenceUnavailable(f"not tried: {reason}", cause=FailureCause.ABANDONED)
            if not self._suspended():
                if self.steadiness.down:
                    await self.canary(sampling, "is the server back, for a trial")
                elif self._idle() and self.now() - self._last_canary >= CONTROL_CANARY_INTERVAL_S:
                    await self.canary(sampling, "a suspect waits for its control, and nothing else runs")
            wait_s = self._wait_s(needed_s, until)
            if wait_s == 0:
                return
            waiting(self.now() + wait_s)
            await asyncio.sleep(min(wait_s, COMEBACK_CANARY_INTERVAL_S, CONTROL_CANARY_INTERVAL_S))

    async def comeback(
        self, sampling: SamplingSettings, failed_at: float, gave_up: Callable[[], str | None], why: str
    ) -> tuple[Ruling, float]:
        """Wait until the server answers a canary again (after the liveness watch resumed the engine, if
        it suspended it); the ruling and how long after `failed_at` it answered."""
        with self._waiting_on_server():
            return await self._comeback(sampling, failed_at, gave_up, why)

    async def _comeback(
        self, sampling: SamplingSettings, failed_at: float, gave_up: Callable[[], str | None], why: str
    ) -> tuple[Ruling, float]:
        deadline = failed_at + self.settings.comeback_limit_s
        before = self._outage()
        try:
            while True:
                if gave_up() is not None:
                    return Ruling.GIVEN_UP, math.nan
                remaining_s = deadline - self.now()
                if remaining_s <= 0:
                    return Ruling.NEVER_BACK, math.nan
                if self._suspended():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._resumed.wait(), min(remaining_s, COMEBACK_CANARY_INTERVAL_S)
                        )
                    continue
                if await self.canary(sampling, why):
                    return Ruling.BACK, self.now() - failed_at
                await asyncio.sleep(min(remaining_s, COMEBACK_CANARY_INTERVAL_S))
        finally:
            after = self._outage()
            self.outage_seen = after if after is not before else None
