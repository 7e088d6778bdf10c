"""A hung request told from a long one by its own progress, in seconds, whatever its max_tokens.

Every request is streamed, and each chunk is its sign of life. A request silent for the silence limit
while the server generated for other requests (a chunk of another one within the last half of the
limit) is hung on its own: it is cancelled (SGLang aborts a request whose client went away) and
raised as InferenceUnavailable with the SILENT cause, so that the usual retry policy applies.

- Every request silent at once: the server itself is hung. That is liveness's to judge (it suspends
  the engine, workers/generate/liveness.py), not a reason to cut the requests one by one.
- A request without its first chunk may be waiting in the server's queue (SGLang answers with the
  first output): it counts as silent only once a request sent after it has started, which SGLang's
  first-come-first-served scheduler (its default policy) does not do while the earlier one waits.
- A lone request has no other to be compared with: the watch asks the server a one-token question
  (as readiness does). Answered within half the limit, the server generates and the silent request
  is cut; unanswered, the server looks hung, and liveness judges.

`SilenceJudge` is the judgement as pure logic, fed the times of events; `SilenceWatch` runs it on the
engine's event loop: one timer per request, due when its silence would reach the limit.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from core.records import Message, SamplingSettings
from inference.chat_stream import ChatResult, ProgressCallback
from inference.errors import FailureCause, InferenceError, InferenceUnavailable
from inference.readiness import READY_MAX_TOKENS, READY_PROMPT

log = logging.getLogger(__name__)

DEFAULT_SILENCE_LIMIT_S = 30.0
"""A running request gets a chunk every decode step or few (SGLang streams every token); a long
prefill of other requests pauses everyone alike. 30 s of one request's silence while others stream
is a hang, and costs that much of one slot."""
SERVER_ACTIVE_FRACTION = 0.5
"""The server counts as generating when another request had a chunk within this fraction of the limit:
a server that hung a moment after the silent request's last chunk is not cutting material."""
RECHECK_FRACTION = 0.25
"""A silent request that is not cut (every request silent, or waiting behind no one) is looked at
again after this fraction of the limit."""
SEND_ORDER_MARGIN_S = 1.0
"""Requests sent closer together than this may reach the server in either order."""
PROBE_RID_PREFIX = "silence-probe"

Ask = Callable[[list[Message], SamplingSettings, str], Awaitable[ChatResult]]
"""The client's `chat`: how the watch asks the server its one-token question."""


class Verdict(enum.Enum):
    WAIT = "wait"  # not silent for the limit, or no proof that the server generates: look again later
    CUT = "cut"  # hung on its own: cancel it
    ASK_SERVER = "ask_server"  # a lone silent request: ask the server whether it generates


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    look_again_at: float
    reason: str = ""


@dataclass
class _Watched:
    sent_at: float
    last_chunk_at: float | None = None


class SilenceJudge:
    """Says, for each request in flight, whether it is hung on its own. Times are monotonic seconds."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._requests: dict[str, _Watched] = {}
        self._server_active_at = -math.inf  # the last chunk of any request, or an answer to a question
        self._latest_started_sent_at = -math.inf  # when the latest-sent request with a chunk was sent

    @property
    def active_window_s(self) -> float:
        return self.limit_s * SERVER_ACTIVE_FRACTION

    def sent(self, key: str, now: float) -> None:
        self._requests[key] = _Watched(sent_at=now)

    def chunk(self, key: str, now: float) -> None:
        watched = self._requests.get(key)
        if watched is None:
            return
        if watched.last_chunk_at is None:
            self._latest_started_sent_at = max(self._latest_started_sent_at, watched.sent_at)
        watched.last_chunk_at = now
        self._server_active_at = now

    def server_answered(self, *, sent_at: float, now: float) -> None:
        """A question sent at `sent_at` was answered: the server generates, and started it."""
        self._latest_started_sent_at = max(self._latest_started_sent_at, sent_at)
        self._server_active_at = max(self._server_active_at, now)

    def settled(self, key: str) -> None:
        self._requests.pop(key, None)

    def judge(self, key: str, now: float) -> Judgement:
        watched = self._requests[key]
        waiting = watched.last_chunk_at is None
        last_sign = watched.sent_at if watched.last_chunk_at is None else watched.last_chunk_at
        silent_s = now - last_sign
        if silent_s < self.limit_s:
            return Judgement(Verdict.WAIT, last_sign + self.limit_s)
        look_again_at = now + self.limit_s * RECHECK_FRACTION
        generating = now - self._server_active_at <= self.active_window_s
        overtaken = self._latest_started_sent_at >= watched.sent_at + SEND_ORDER_MARGIN_S
        if generating and (overtaken or not waiting):
            if waiting:
                reason = f"no first chunk in {silent_s:.0f} s, while requests sent after it started"
            else:
                reason = f"silent for {silent_s:.0f} s after its last chunk, while the server generated"
            return Judgement(Verdict.CUT, now, f"{reason} (silence limit {self.limit_s:g} s): taken for hung")
        if len(self._requests) == 1:
            return Judgement(Verdict.ASK_SERVER, look_again_at)
        return Judgement(Verdict.WAIT, look_again_at)


@dataclass(eq=False)
class _Guarded:
    sampling: SamplingSettings
    task: asyncio.Future[ChatResult] | None = None
    timer: asyncio.TimerHandle | None = None
    cut_because: str | None = None


class SilenceWatch:
    """Guards each request sent through it; used on one event loop (the engine's)."""

    def __init__(self, limit_s: float, ask: Ask) -> None:
        self._judge = SilenceJudge(limit_s)
        self._ask = ask
        self._guarded: dict[str, _Guarded] = {}
        self._question: asyncio.Task[None] | None = None

    async def guard(
        self, key: str, sampling: SamplingSettings, start: Callable[[ProgressCallback], Awaitable[ChatResult]]
    ) -> ChatResult:
        """`start(on_progress)`'s result; InferenceUnavailable (SILENT) if it was cut for silence."""
        loop = asyncio.get_running_loop()
        self._judge.sent(key, loop.time())
        guarded = self._guarded[key] = _Guarded(sampling)
        task = guarded.task = asyncio.ensure_future(start(lambda: self._judge.chunk(key, loop.time())))
        guarded.timer = loop.call_at(loop.time() + self._judge.limit_s, self._look, key)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if guarded.cut_because is None or (current is not None and current.cancelling()):
                raise
            raise InferenceUnavailable(guarded.cut_because, cause=FailureCause.SILENT) from None
        finally:
            guarded.timer.cancel()
            self._judge.settled(key)
            del self._guarded[key]

    def _look(self, key: str) -> None:
        guarded = self._guarded.get(key)
        if guarded is None or guarded.task is None or guarded.cut_because is not None:
            return
        loop = asyncio.get_running_loop()
        judgement = self._judge.judge(key, loop.time())
        if judgement.verdict is Verdict.CUT:
            log.warning("request %s: %s; cancelled", key, judgement.reason)
            guarded.cut_because = judgement.reason
            guarded.task.cancel()
            return
        if judgement.verdict is Verdict.ASK_SERVER:
            self._ask_server(guarded.sampling)
        if guarded.timer is not None:
            guarded.timer.cancel()
        guarded.timer = loop.call_at(judgement.look_again_at, self._look, key)

    def _ask_server(self, sampling: SamplingSettings) -> None:
        if self._question is None or self._question.done():
            self._question = asyncio.ensure_future(self._question_server(sampling))

    async def _question_server(self, sampling: SamplingSettings) -> None:
        """Ask a one-token question; answered in time, look at every request again at once."""
        if not await self.server_generates(sampling, why="a lone request is silent"):
            return
        for key in list(self._guarded):
            self._look(key)

    async def server_generates(self, sampling: SamplingSettings, *, why: str) -> bool:
        """Whether the server answers a one-token question within half the limit (as readiness asks
        it): it generates, whatever happened to one request of it."""
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        question = msgspec.structs.replace(sampling, max_tokens=READY_MAX_TOKENS)
        rid = f"{PROBE_RID_PREFIX}:{uuid.uuid4().hex[:8]}"
        try:
            async with asyncio.timeout(self._judge.active_window_s):
                await self._ask([Message(role="user", content=READY_PROMPT)], question, rid)
        except (InferenceError, TimeoutError) as error:
            log.warning(
                "%s, and the server did not answer a one-token question in %g s (%s)",
                why,
                self._judge.active_window_s,
                str(error) or "timed out",
            )
            return False
        self._judge.server_answered(sent_at=sent_at, now=loop.time())
        return True

    async def close(self) -> None:
        if self._question is not None:
            self._question.cancel()
            await asyncio.gather(self._question, return_exceptions=True)
