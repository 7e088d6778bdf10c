"""Poison prompts: dead-lettered on proof, never on a guess (docs/exactly-once.md, "Poison prompts").

A request that gets no answer may be the prompt's doing or the server's. Two kinds of evidence, kept per
prompt in Redis (`strikes`) across workers, servers and server lives, as a log of events:

- a **suspicion** (cheap, and may be wrong): the prompt was in flight when the server went down or
  was declared hung by the liveness watch, or its own request went silent or lost its connection while
  the server went on (SGLang's retraction and a proxy's idle timeout look like that too). Suspicions
  never convict; `suspicions_before_trial` of them make the prompt a suspect.
- a **trial** (`TrialBegun`, then `TrialEnded`): a suspect is sent alone (nothing else of its worker in
  flight) right after the server answered a one-token canary. A trial *convicts* only when the server
  failed while the suspect ran alone (it went down, dropped the request, stopped making progress for
  the liveness stall window, or left the suspect silent that long while still answering), the server
  then came back and answered a canary again, and the control holds: before the trial the server had
  worked without failing, and its mean time between failures (as its worker saw them, trials left out)
  was, at least `control_factor` times as long as the suspect took to fail. A trial the
  suspect completes *acquits* it: everything recorded before is forgotten. Any other trial (the worker
  gave it up, the server did not come back, the control was too short, a trial begun and never ended
  because its worker died) is *void*, until the worker's successor closes a trial its dead predecessor
  left open (`killed`): the worker died while the suspect ran alone, which convicts on the same control,
  timed up to the successor's start.
- a worker that died holding a batch (its successor took the batch back) leaves each of the batch's prompts
  still to generate a suspicion (`WORKER_DIED`): a prompt that kills its worker process is tried alone too.

`convictions_to_dead` convictions dead-letter the prompt as `poison_prompt`, its letter describing each
trial. The verdict is a pure function of the recorded events (`PoisonPolicy.judge`); the record is
bounded when written (`EVIDENCE_MAX_BYTES`, oldest events first out) and decoded with a bound, a line
that is not an event of ours counting as no evidence.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from core.records import Record

log = logging.getLogger(__name__)

DEFAULT_SUSPICIONS_BEFORE_TRIAL = 2
"""A prompt in flight at one server failure is one of ~48; at two it is one of few (its batchmates travel
with it). One trial per prompt in flight at every crash would cost a crash ~10 minutes of one GPU."""
DEFAULT_CONVICTIONS_TO_DEAD = 3
DEFAULT_CONTROL_FACTOR = 20.0
"""A server failing at random, independently of the prompt, convicts a trial only with a failure within
1/20 of its mean time between failures: under 5% of trials whatever its rate (docs/exactly-once.md)."""
MIN_TIMING_S = 0.25
"""A failure is timed to a few stream chunks (SGLang streams every decode step, tens of milliseconds; a
lost connection is seen when it happens; a wedge is timed by the liveness poll, which the worker adds):
a shorter time to fail is taken as this, so that no control of zero seconds can convict."""
CANARY_FRESH_S = 5.0
"""The canary before a trial must have answered at most this long before the suspect was sent."""
EVIDENCE_MAX_BYTES = 8192
"""Per prompt, as written by the `strike` function: about 25 events, far more than a verdict needs."""
EVIDENCE_READ_MAX_BYTES = 2 * EVIDENCE_MAX_BYTES
"""A longer record was not written by draftgen: it is read as no evidence at all."""
NOTE_MAX_CHARS = 300
CONTROL_WAIT_FACTOR = 3.0
"""A suspect waits up to this many times the control it needs for its server to show it, and the server's
mean time between failures is taken over as long (`control_window_s`): once it fails no more, any server
shows the control within that wait, however often it failed before. One that cannot show it in that time
(it fails too often) gets the suspect at once: a trial the control does not back cannot convict, but it
can acquit, and no suspect waits for ever."""
WORKER_DIED = "worker died"
"""A suspicion's cause when the prompt's worker died holding it (its successor took its batch back)."""
NEXT_FAILURE_HEADROOM = 1.5
"""The next trial waits for the control of a failure this much slower than the last, as timed: the same
prompt fails a little later or sooner each time (a dropped connection by the chunks it got first, a
killed worker by how long its successor took to start), and a trial whose failure comes a little later
than the control it waited for is void, costing another trial."""


class TrialEnd(enum.StrEnum):
    """How a trial ended, as its worker saw it."""

    COMPLETED = "completed"  # the suspect got its answer
    WENT_DOWN = "the server went down"  # its connection lost, and the server answered no canary
    DROPPED = "its connection dropped while the server still answered"
    WEDGED = "the server stopped making progress"  # liveness: no token for the stall window
    SILENT = "it was silent while the server still answered"  # for the stall window, alone
    KILLED = "its worker died while it ran alone"  # closed by the worker's successor, timed to its start
    GIVEN_UP = "given up"  # the worker stopped, the lease was lost, an error status: no verdict


class Outcome(enum.StrEnum):
    ACQUITTED = "acquitted"
    CONVICTED = "convicted"
    VOID = "void"


class Verdict(enum.Enum):
    AS_USUAL = "as usual"
    TRIAL = "try it alone"
    DEAD = "dead-letter it"


class Suspicion(Record, frozen=True, tag="suspicion"):
    """A request of the prompt got no answer where the failure may be the server's."""

    life: str  # the server and its life: `<worker label>#<process>.<n>`
    cause: str  # a FailureCause value, or a Liveness value ("hung", "down") when the watch gave it up
    with_server: bool  # the server failed too (went down, hung): everything in flight failed with it
    at: float  # Unix time


class TrialBegun(Record, frozen=True, tag="trial"):
    """A suspect sent alone; never followed by its `TrialEnded` when its worker died during it (void)."""

    trial: str  # an id, shared with the TrialEnded
    life: str
    started_at: float  # Unix time
    canary_before_s: float  # the server answered a one-token canary this long before the suspect was sent
    control_s: float  # the server had worked this long without failing, as its worker saw it
    mean_up_s: float  # its mean time between failures, as its worker saw them (trials left out)

    def end(
        self,
        ending: TrialEnd,
        *,
        failed_after_s: float = 0.0,
        canary_after_s: float | None = None,
        note: str = "",
    ) -> TrialEnded:
        """This trial's end, as recorded: times to the millisecond, the note within NOTE_MAX_CHARS."""
        return TrialEnded(
            **msgspec.structs.asdict(self),
            ended=ending,
            failed_after_s=round(failed_after_s, 3),
            canary_after_s=None if canary_after_s is None else round(canary_after_s, 3),
            note=note[:NOTE_MAX_CHARS],
        )


class TrialEnded(Record, frozen=True, tag="verdict"):
    trial: str
    life: str
    started_at: float
    canary_before_s: float
    control_s: float
    mean_up_s: float
    ended: TrialEnd
    failed_after_s: float = 0.0  # from the start to the failure (to the suspect's last sign of life)
    canary_after_s: float | None = None  # the server answered a canary this long after; None: never
    note: str = ""


Evidence = Suspicion | TrialBegun | TrialEnded
_Line = msgspec.json.Decoder(Evidence)
_encoder = msgspec.json.Encoder()


def encode_evidence(event: Evidence) -> bytes:
    """One line of a prompt's record (no newline: the `strike` function adds it)."""
    return _encoder.encode(event)


def decode_evidence(raw: bytes | None, prompt_id: str = "") -> list[Evidence]:
    """A prompt's record read back from Redis, oldest event first. A record longer than
    EVIDENCE_READ_MAX_BYTES is no evidence at all; a line that is not one of our events is skipped."""
    if not raw:
        return []
    if len(raw) > EVIDENCE_READ_MAX_BYTES:
        log.warning("prompt %s: a poison record of %d bytes is read as no evidence", prompt_id, len(raw))
        return []
    events: list[Evidence] = []
    for line in raw.split(b"\n"):
        if not line:
            continue
        try:
            events.append(_Line.decode(line))
        except msgspec.DecodeError as error:  # ValidationError is a DecodeError
            log.warning("prompt %s: a line of its poison record is no evidence: %s", prompt_id, error)
    return events


@dataclass(frozen=True)
class PoisonPolicy:
    suspicions_before_trial: int = DEFAULT_SUSPICIONS_BEFORE_TRIAL
    convictions_to_dead: int = DEFAULT_CONVICTIONS_TO_DEAD
    control_factor: float = DEFAULT_CONTROL_FACTOR

    def control_needed_s(self, failed_after_s: float) -> float:
        """The failure-free work a server must have shown before a trial that failed this fast."""
        return self.control_factor * max(failed_after_s, MIN_TIMING_S)

    def outcome(self, ended: TrialEnded) -> Outcome:
        return Outcome.ACQUITTED if ended.ended is TrialEnd.COMPLETED else self._failed(ended)[0]

    def why(self, ended: TrialEnded) -> str:
        """Why a failed trial convicts or is void, in words."""
        return self._failed(ended)[1]

    def _failed(self, ended: TrialEnded) -> tuple[Outcome, str]:
        if ended.ended is TrialEnd.GIVEN_UP:
            return Outcome.VOID, f"given up: {ended.note}" if ended.note else "given up"
        if ended.canary_before_s > CANARY_FRESH_S:
            return (
                Outcome.VOID,
                f"its canary answered {ended.canary_before_s:.0f} s before it, not just before",
            )
        if ended.canary_after_s is None and ended.ended is not TrialEnd.KILLED:
            return Outcome.VOID, "the server did not answer a canary again: it was broken, not the prompt"
        needed_s = self.control_needed_s(ended.failed_after_s)
        if min(ended.control_s, ended.mean_up_s) < needed_s:
            return Outcome.VOID, (
                f"the server had worked {ended.control_s:.1f} s without failing before it, and failed "
                f"every {ended.mean_up_s:.1f} s on average: a failure {ended.failed_after_s:.1f} s in needs "
                f"{needed_s:.1f} s of both"
            )
        return Outcome.CONVICTED, "convicted"

    def judge(self, evidence: Sequence[Evidence]) -> Verdict:
        """What to do with the prompt, from its record alone."""
        current = since_acquittal(evidence, self)
        convictions = sum(
            1 for e in current if isinstance(e, TrialEnded) and self.outcome(e) is Outcome.CONVICTED
        )
        if convictions >= self.convictions_to_dead:
            return Verdict.DEAD
        suspicions = sum(1 for e in current if isinstance(e, Suspicion))
        tried = any(isinstance(e, TrialBegun | TrialEnded) for e in current)
        return Verdict.TRIAL if tried or suspicions >= self.suspicions_before_trial else Verdict.AS_USUAL

    def control_before_trial_s(self, evidence: Sequence[Evidence], timing_floor_s: float) -> float:
        """The failure-free work a server must show before this suspect's next trial, so that a failure
        as fast as its last one convicts, timed as that one was (`timed_failure_s`; a first trial: a
        failure as fast as a wedge can be timed, `timing_floor_s`). The last one, not the slowest: a
        failure of the server's own long ago, or its worker killed by something else, holds up only the
        next trial; a suspect whose failures come later each time is given each one's control in turn."""
        failed = failed_trials(since_acquittal(evidence, self))
        if not failed:
            return self.control_needed_s(timing_floor_s)
        return self.control_needed_s(timed_failure_s(failed[-1], timing_floor_s))


def failed_trials(evidence: Sequence[Evidence]) -> list[TrialEnded]:
    """The trials in `evidence` that failed: neither completed nor given up."""
    return [
        e
        for e in evidence
        if isinstance(e, TrialEnded) and e.ended not in (TrialEnd.COMPLETED, TrialEnd.GIVEN_UP)
    ]


def timed_failure_s(ended: TrialEnded, timing_floor_s: float) -> float:
    """How fast a failed trial's suspect should be taken to fail next time: as it failed last, with
    NEXT_FAILURE_HEADROOM, by how its failure was timed: a wedge by the liveness watch's polls (no faster
    than `timing_floor_s`), a worker's death up to its successor's start, a drop or a silence to the chunk."""
    later_s = ended.failed_after_s * NEXT_FAILURE_HEADROOM
    return max(later_s, timing_floor_s) if ended.ended is TrialEnd.WEDGED else later_s


def open_trials(evidence: Sequence[Evidence], life_prefix: str) -> list[TrialBegun]:
    """The trials begun on a server life starting with `life_prefix` and never ended (their worker died)."""
    ended = {e.trial for e in evidence if isinstance(e, TrialEnded)}
    return [
        e
        for e in evidence
        if isinstance(e, TrialBegun) and e.trial not in ended and e.life.startswith(life_prefix)
    ]


def since_acquittal(evidence: Sequence[Evidence], policy: PoisonPolicy) -> Sequence[Evidence]:
    """The events after the last acquittal: a prompt that completed alone owes nothing from before."""
    for index in range(len(evidence) - 1, -1, -1):
        event = evidence[index]
        if isinstance(event, TrialEnded) and policy.outcome(event) is Outcome.ACQUITTED:
            return evidence[index + 1 :]
    return evidence


def _moment(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


def _trial_line(ended: TrialEnded) -> str:
    server = ended.life.split("#", 1)[0]
    if ended.ended is TrialEnd.KILLED:
        back = "its successor working"
    elif ended.canary_after_s is not None:
        back = f"back {ended.canary_after_s:.1f} s after"
    else:
        back = "never back"
    return (
        f"on {server} (life {ended.life}) at {_moment(ended.started_at)}, {ended.ended} "
        f"{ended.failed_after_s:.1f} s in (canary {ended.canary_before_s:.1f} s before, {back}; "
        f"{ended.control_s:.0f} s without failing before, {ended.mean_up_s:.0f} s between failures)"
    )


def describe(evidence: Sequence[Evidence], policy: PoisonPolicy) -> str:
    """The dead letter's error: every trial that convicted, what was void, the suspicions before.

    `no answer alone 3 times, the server answering a canary before and after each: on h/gpu0 (...)`."""
    current = since_acquittal(evidence, policy)
    ended = [e for e in current if isinstance(e, TrialEnded)]
    convicted = [e for e in ended if policy.outcome(e) is Outcome.CONVICTED]
    void = len(ended) - len(convicted)
    open_trials = {e.trial for e in current if isinstance(e, TrialBegun)} - {e.trial for e in ended}
    suspicions = Counter(
        f"{e.cause} with the server" if e.with_server else e.cause
        for e in current
        if isinstance(e, Suspicion)
    )
    killed = sum(1 for e in convicted if e.ended is TrialEnd.KILLED)
    died = f" (its worker died in {killed} of them)" if killed else ""
    parts = [
        f"no answer alone {len(convicted)} times{died}, the server answering a canary before and after "
        "each: " + "; ".join(_trial_line(e) for e in convicted)
    ]
    if void or open_trials:
        parts.append(f"{void + len(open_trials)} more trials void")
    if suspicions:
        listed = ", ".join(f"{cause} ({count})" for cause, count in suspicions.most_common())
        parts.append(f"suspected after: {listed}")
    return ". ".join(parts)
