"""Poison prompts: a prompt that hangs, drops or crashes the server every time is dead-lettered, not
handed back forever.

A request that gets no answer is retried, and its batch handed back, as long as the failure may be the
server's. Each such failure of a sent request is judged against the server:
- on its own (a strike): the request was cut for its own silence while the server generated for others,
  or its connection dropped while the server still answers, or it failed while sent alone;
- with the server (a co-failure): the server itself went down or stopped answering. Every request in
  flight then fails together, and the prompt is only a suspect; a prompt that was there for
  `co_failures_before_alone` such failures is sent alone from then on (nothing else of its worker in
  flight), so that a failure alone tells.

Strikes are kept in Redis per prompt (`strikes`), across workers, servers and server lives (a server
life ends at each co-failure: the server went down). A prompt with `strikes_to_dead` strikes on at
least `lives_to_dead` servers or server lives, or `strikes_on_one_server` anywhere (a fleet of one GPU
has one server), is dead-lettered with the reason `poison_prompt` and what happened each time; the
rest of its batch goes on as usual.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass

from inference.errors import FailureCause
from inference.records import Record

STRIKING_CAUSES = frozenset(
    {FailureCause.SILENT, FailureCause.DROPPED, FailureCause.TIMED_OUT, FailureCause.MALFORMED}
)
"""Failures of a request the server received and did not answer; refused connections, HTTP errors
(retried, then dead-lettered as `failed_every_attempt`) and requests given up by the worker are not."""
STRIKES_KEPT = 32  # per prompt: enough to describe it, bounded whatever happens

DEFAULT_STRIKES_TO_DEAD = 3
DEFAULT_LIVES_TO_DEAD = 2
DEFAULT_STRIKES_ON_ONE_SERVER = 5
DEFAULT_CO_FAILURES_BEFORE_ALONE = 2

CAUSE_WORDS = {
    FailureCause.SILENT: "silent while the server generated",
    FailureCause.DROPPED: "its connection dropped",
    FailureCause.TIMED_OUT: "timed out",
    FailureCause.MALFORMED: "a malformed answer",
}


class Strike(Record, frozen=True):
    """One failed request of a prompt."""

    life: str  # the server and its life: `<worker label>#<process>.<n>`
    cause: str  # a FailureCause value
    on_its_own: bool  # a strike; False: a co-failure, the server failed with it
    alone: bool = False  # it was sent with nothing else in flight


class Verdict(enum.Enum):
    AS_USUAL = "as usual"
    ALONE = "send it alone"
    DEAD = "dead-letter it"


@dataclass(frozen=True)
class PoisonPolicy:
    strikes_to_dead: int = DEFAULT_STRIKES_TO_DEAD
    lives_to_dead: int = DEFAULT_LIVES_TO_DEAD
    strikes_on_one_server: int = DEFAULT_STRIKES_ON_ONE_SERVER
    co_failures_before_alone: int = DEFAULT_CO_FAILURES_BEFORE_ALONE

    def judge(self, strikes: list[Strike]) -> Verdict:
        own = [s for s in strikes if s.on_its_own]
        lives = {s.life for s in own}
        if len(own) >= self.strikes_on_one_server or (
            len(own) >= self.strikes_to_dead and len(lives) >= self.lives_to_dead
        ):
            return Verdict.DEAD
        if len(strikes) - len(own) >= self.co_failures_before_alone or any(s.alone for s in own):
            return Verdict.ALONE
        return Verdict.AS_USUAL


def describe(strikes: list[Strike]) -> str:
    """`no answer 5 times on 2 servers: silent while the server generated (3), its connection dropped (2)`."""
    own = [s for s in strikes if s.on_its_own]
    causes = Counter(CAUSE_WORDS.get(FailureCause(s.cause), s.cause) for s in own)
    servers = {s.life.split("#", 1)[0] for s in own}
    lives = {s.life for s in own}
    where = f"{len(servers)} server{'s' if len(servers) != 1 else ''}"
    if len(lives) > len(servers):
        where += f" ({len(lives)} server lives)"
    listed = ", ".join(f"{cause} ({count})" for cause, count in causes.most_common())
    together = len(strikes) - len(own)
    also = f"; {together} more with the server failing too" if together else ""
    return f"no answer {len(own)} times on {where}: {listed}{also}"
