"""Generating a batch's completions while keeping the server's slots full across batch boundaries.

One `GenerationEngine` per worker process owns an event loop thread, one client, and one in-flight
window (a FIFO semaphore sized to the server's running-request slots). Every batch the worker holds
feeds the same window, so while one batch's slowest requests finish, the next batch's prompts
already occupy the freed slots.

`submit_batch` returns a `BatchJob` at once: its `sent` event is set when every prompt of the batch
has been sent (or settled without a request), its `outcome` when every prompt is settled. A caller
that only waits for `sent` can take the next batch while this one's long requests finish: with
reasoning lengths' heavy tail, a batch spends most of its life waiting for one or two of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import msgspec

from core.backoff import backoff_delay_s
from core.records import (
    Answer,
    Completion,
    DeadLetter,
    DeadLetterReason,
    Message,
    Origin,
    Prompt,
    Quality,
    SamplingSettings,
    Timings,
    Turn,
    fields_of,
)
from core.run_settings.model import DEFAULT_RETRY_MAX_TOKENS_CAP, TruncationPolicy
from inference.chat_stream import ChatResult, ProgressCallback
from inference.errors import FailureCause, InferenceRejected, InferenceUnavailable
from inference.quality import label_completion
from inference.sglang_defaults import BUDGET_GROWTH_FACTOR
from workers.errors import RecordTooLarge
from workers.generate.liveness import Outage
from workers.generate.recent_output import RecentOutput
from workers.generate.silence import DEFAULT_SILENCE_LIMIT_S, SilenceWatch
from workers.generate.trials import AbandonedInFlight, Court, ProvenPoison, Steadiness, TrialSettings
from workers.generate.tribunal import Tribunal
from workers.generate.turn_saves import TurnSaves
from workers.generate.window import InFlightWindow
from workers.state.heartbeats import TrialPlan
from workers.state.ledger import gpu_label
from workers.state.poison import Evidence, PoisonPolicy, TrialEnded, Verdict, describe

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

REASON_REJECTED = "rejected_by_server"
REASON_EXHAUSTED = "failed_every_attempt"
REASON_TRUNCATED = "truncated_in_thinking"
REASON_POISON = DeadLetterReason.POISON_PROMPT.value
REASON_TOO_LARGE = DeadLetterReason.RECORD_TOO_LARGE.value
# SGLang adds speculative decoding's reserved tokens, max(topk * steps, draft tokens), to the input
# before its context check (4 for NEXTN 3/1/4, 20 for 5/4/8), and usage.prompt_tokens leaves them
# out: a budget of exactly context - prompt_tokens is refused. Headroom for any usual setting.
CONTEXT_HEADROOM_TOKENS = 64
# Hand-over threads per window slot: each slot writes one record at a time (a stage, a dead letter, or a
# conversation's turns so far), and a conversation's stage may still be landing when the slot's next
# request finishes; with this many, no write ever waits for a thread.
HANDOVER_THREADS_PER_SLOT = 2


class ChatClient(Protocol):
    async def chat(
        self,
        messages: list[Message],
        sampling: SamplingSettings,
        rid: str,
        on_progress: ProgressCallback | None = None,
    ) -> ChatResult: ...
    async def close(self) -> None: ...


@runtime_checkable
class StatesContextLength(Protocol):
    """A client that can ask its server for the context length (SGLangClient does)."""

    async def context_length(self) -> int | None: ...


class Handover(Protocol):
    """Where finished work goes: the upload path (staged) or the dead-letter set; the poison record of
    prompts (suspicions and trials), kept across workers (workers/state/poison.py); and the finished turns
    of conversations not yet staged, for a later delivery to resume at the next turn. Blocking calls."""

    def stage(self, completion: Completion) -> bool: ...
    def dead_letter(self, letter: DeadLetter) -> bool: ...
    def strike(self, prompt_id: str, event: Evidence) -> list[Evidence]: ...
    def strikes_of(self, prompt_ids: Sequence[str]) -> dict[str, list[Evidence]]: ...
    def keep_turns(self, prompt_id: str, turns: list[Turn]) -> bool: ...
    def kept_turns(self, prompt_ids: Sequence[str]) -> dict[str, list[Turn]]: ...


@dataclass(frozen=True)
class Truncation:
    """How a run treats thinking cut off by the budget (see workers.state.runs.TruncationPolicy)."""

    policy: TruncationPolicy = TruncationPolicy.KEEP
    max_tokens_cap: int = DEFAULT_RETRY_MAX_TOKENS_CAP

    def next_budget(
        self, max_tokens: int, *, prompt_tokens: int = 0, context_length: int | None = None
    ) -> int | None:
        """The larger budget to retry with, or None when the policy, the cap or the context says no.

        The budget grows by BUDGET_GROWTH_FACTOR up to the cap and to what the server's context leaves
        after this prompt (less CONTEXT_HEADROOM_TOKENS); a server that does not state its context
        (None) is capped by the cap alone. When that is no larger than `max_tokens`: no retry, keep
        what there is."""
        if self.policy is not TruncationPolicy.RETRY:
            return None
        ceiling = self.max_tokens_cap
        if context_length is not None:
            ceiling = min(ceiling, context_length - prompt_tokens - CONTEXT_HEADROOM_TOKENS)
        larger = min(max_tokens * BUDGET_GROWTH_FACTOR, ceiling)
        return larger if larger > max_tokens else None


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float


@dataclass
class BatchOutcome:
    staged: int = 0
    output_tokens: int = 0  # of the completions staged
    dead_lettered: int = 0
    already_handled: int = 0
    unreachable: list[str] = field(default_factory=list)  # prompt ids left for a later delivery
    last_error: str = ""


def build_completion(
    prompt: Prompt,
    result: ChatResult,
    sampling: SamplingSettings,
    origin: Origin,
    attempt: int,
    budget_retries: int = 0,
) -> Completion:
    return Completion(
        **fields_of(result, Answer),
        prompt_id=prompt.id,
        messages=prompt.messages,
        timings=Timings(
            started_at=result.started_at,
            finished_at=result.finished_at,
            latency_s=result.finished_at - result.started_at,
        ),
        model=sampling.model,
        sampling=sampling,
        origin=origin,
        attempt=attempt,
        quality=label_completion(
            content=result.content,
            reasoning_content=result.reasoning_content,
            finish_reason=result.finish_reason,
            thinking_enabled=sampling.enable_thinking,
        ),
        budget_retries=budget_retries,
        columns=prompt.columns,
    )


def _always() -> bool:
    return True


@dataclass
class _Job:
    run: str
    sampling: SamplingSettings
    handover: Handover
    truncation: Truncation
    outcome: BatchOutcome
    still_held: Callable[[], bool] = _always  # False once the batch's lease is gone: send nothing more
    unsent: int = 0  # prompts whose first request has not been sent yet
    sent: threading.Event = field(default_factory=threading.Event)
    sent_ids: set[str] = field(default_factory=set)
    suspects: set[str] = field(default_factory=set)  # tried alone (workers/state/poison.py)
    evidence: dict[str, list[Evidence]] = field(default_factory=dict)  # the poison records last read
    kept_turns: dict[str, list[Turn]] = field(default_factory=dict)  # conversations' finished turns
    turn_at: dict[str, tuple[int, int]] = field(default_factory=dict)  # conversation -> (turn, of)

    def mark_sent(self, prompt_id: str) -> None:
        """The prompt's first request went out, or it settled without one. Called on the loop only."""
        if prompt_id in self.sent_ids:
            return
        self.sent_ids.add(prompt_id)
        self.unsent -= 1
        if self.unsent <= 0:
            self.sent.set()


@dataclass(frozen=True)
class BatchJob:
    """A batch at work on the engine's loop."""

    sent: threading.Event  # every prompt has been sent, or settled without a request
    done: Future[BatchOutcome]

    def wait_sent(self) -> None:
        self.sent.wait()

    def outcome(self) -> BatchOutcome:
        return self.done.result()


class GenerationEngine:
    # the server's context length, looked up lazily by _server_context_length (not in __init__)
    _context_length_lookup: asyncio.Future[int | None] | None = None

    def __init__(
        self,
        client_factory: Callable[[], ChatClient],
        *,
        max_in_flight: int,
        retry: RetryPolicy,
        origin: Origin,
        silence_limit_s: float = DEFAULT_SILENCE_LIMIT_S,
        poison: PoisonPolicy | None = None,
        trials: TrialSettings | None = None,
        server_identity: str = "",
    ) -> None:
        self._retry = retry
        self.origin = origin  # the worker names the server's facts in it once it has read them
        self._poison = poison or PoisonPolicy()
        self._server_identity = server_identity or uuid.uuid4().hex[:8]  # which server, which process
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="generation-loop", daemon=True)
        self._thread.start()
        self._window = InFlightWindow(max_in_flight)
        self._handover_threads = ThreadPoolExecutor(
            max_in_flight * HANDOVER_THREADS_PER_SLOT, thread_name_prefix="draftgen-handover"
        )
        self._nobody_alone, self._idle, self._resumed = self._call(self._make_events())
        self._alone_lock = self._call(self._make_lock())
        self._client: ChatClient = self._call(self._make_client(client_factory))
        self._silence = SilenceWatch(silence_limit_s, self._client.chat)
        trial_settings = trials or TrialSettings()
        self._steadiness = Steadiness(since=self._loop.time())  # the loop's clock is time.monotonic
        self._tribunal = Tribunal(
            self._poison,
            Court(
                trial_settings,
                self._steadiness,
                self._silence.server_generates,
                suspended=lambda: self._suspended_because is not None,
                resumed=self._resumed,
                idle=lambda: not self._in_flight,
                outage=lambda: self._last_outage,
            ),
            SilenceWatch(trial_settings.silence_limit_s, self._client.chat),
            self._in_thread,
            self._life,
            lambda: self._slot(alone=True),
        )
        self._in_flight: set[asyncio.Task[ChatResult]] = set()
        self.recent_output = RecentOutput()  # what it staged over the last minute (Flower's worker page)
        self._suspects_waiting = 0
        self._suspended_because: str | None = None
        self._outage: Outage | None = None
        self._last_outage: Outage | None = None  # kept after the engine resumes: a trial's comeback reads it
        self._draining = False

    @staticmethod
    async def _make_events() -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
        nobody_alone, idle, resumed = asyncio.Event(), asyncio.Event(), asyncio.Event()
        nobody_alone.set()
        idle.set()
        resumed.set()
        return nobody_alone, idle, resumed

    @staticmethod
    async def _make_lock() -> asyncio.Lock:
        return asyncio.Lock()

    @staticmethod
    async def _make_client(factory: Callable[[], ChatClient]) -> ChatClient:
        return factory()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def awaiting_server(self) -> int:
        """Answers this worker's suspects wait for from its server (`Court.awaiting_server`; any thread)."""
        return self._tribunal.court.awaiting_server

    @property
    def trial_settings(self) -> TrialSettings:
        return self._tribunal.court.settings

    def trial_plans(self) -> tuple[TrialPlan, ...]:
        """The suspects of poison this engine holds, waiting for their trials or on trial (any thread)."""
        return self._tribunal.trial_plans()

    @property
    def waiting_for_slot(self) -> int:
        """Prompts and conversations waiting for a slot of the window."""
        return self._window.waiting

    @property
    def suspended(self) -> bool:
        return self._suspended_because is not None

    @property
    def suspended_because(self) -> str | None:
        """Why the engine sends nothing (its server hung or down), or None while it sends."""
        return self._suspended_because

    def suspend(self, reason: str, outage: Outage | None = None) -> None:
        """Stop sending requests and abandon those in flight: their prompts go back with their batches.

        Used when the liveness watch finds the server hung or down (`outage`: its prompts in flight are
        suspects of poison). Every batch held returns promptly with those prompts left pending, so its
        message is delivered again (to this worker once resumed, or another); a trial in progress waits
        for the server to come back, holding it alone.
        """
        self._call(self._suspend(reason, outage))

    async def _suspend(self, reason: str, outage: Outage | None = None) -> None:
        self._suspended_because = reason
        self._outage = outage
        if outage is not None:
            self._last_outage = outage
            self._resumed.clear()
            self._steadiness.failed(self._loop.time(), server_down=True)
        for task in list(self._in_flight):
            task.cancel()

    def resume(self) -> None:
        self._call(self._resume())

    async def _resume(self) -> None:
        self._suspended_because = None
        self._outage = None
        self._steadiness.back(self._loop.time())
        self._resumed.set()

    def note_restart(self, reason: str, started_at: float | None = None) -> None:
        """The server restarted behind this worker's back (the liveness watch saw it start again at Unix
        time `started_at`, or its counters go back): a failure, for the control of poison trials, unless
        this worker saw the server back since then already (a trial's crash it waited for)."""
        log.warning("%s", reason)
        since_s = 0.0 if started_at is None else max(0.0, time.time() - started_at)
        self._loop.call_soon_threadsafe(lambda: self._steadiness.restarted(self._loop.time() - since_s))

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self, *, grace_s: float) -> None:
        """The worker is stopping: send nothing new; requests in flight get `grace_s`, then are abandoned.

        Safe to call from a signal handler: it only schedules work on the engine's loop. Every held
        batch then returns with its unsent and abandoned prompts pending, to be handed back.
        """
        self._loop.call_soon_threadsafe(self._begin_drain, grace_s)

    def _begin_drain(self, grace_s: float) -> None:
        self._draining = True
        self._loop.call_later(grace_s, lambda: asyncio.ensure_future(self._suspend("shutdown grace over")))

    def _stop_reason(self, job: _Job) -> str | None:
        """Why no new request of this job may be sent, or None."""
        return self._suspended_because or self._given_up(job)

    def submit_batch(
        self,
        run: str,
        prompts: list[Prompt],
        sampling: SamplingSettings,
        handover: Handover,
        truncation: Truncation | None = None,
        *,
        still_held: Callable[[], bool] = _always,
    ) -> BatchJob:
        """Start generating a batch on the engine's loop; see `BatchJob`. Each result is handed over as
        soon as it exists. Prompts left unanswered (server unreachable, worker suspended or stopping,
        lease lost) are listed in the outcome's `unreachable`, for the batch to be handed back."""
        job = _Job(run, sampling, handover, truncation or Truncation(), BatchOutcome(), still_held)
        job.unsent = len(prompts)
        if not prompts:
            job.sent.set()
        done = asyncio.run_coroutine_threadsafe(self._all(job, prompts), self._loop)
        done.add_done_callback(lambda _: job.sent.set())  # settled, sent or not
        return BatchJob(job.sent, done)

    async def _all(self, job: _Job, prompts: list[Prompt]) -> BatchOutcome:
        if prompts:  # one read a batch: which of its prompts failed before, here or elsewhere
            job.evidence = await self._in_thread(job.handover.strikes_of, [p.id for p in prompts])
            job.suspects.update(
                prompt_id
                for prompt_id, evidence in job.evidence.items()
                if self._poison.judge(evidence) is Verdict.TRIAL
            )
        conversations = [p.id for p in prompts if p.turn_ends]
        with self._window.arriving() if conversations else contextlib.nullcontext():
            if conversations:
                job.kept_turns = await self._in_thread(job.handover.kept_turns, conversations)
            each = [asyncio.ensure_future(self._one(job, p)) for p in prompts]
            await asyncio.sleep(0)  # each prompt's first step runs to its slot's request (or its slot)
        await asyncio.gather(*each)
        return job.outcome

    async def _one(self, job: _Job, prompt: Prompt) -> None:
        try:
            await self._generate(job, prompt)
        finally:
            job.mark_sent(prompt.id)

    async def _generate(self, job: _Job, prompt: Prompt) -> None:
        evidence = job.evidence.get(prompt.id, [])
        if self._poison.judge(evidence) is Verdict.DEAD:  # its worker died between the proof and the letter
            await self._dead_letter_poison(job, prompt, evidence)
            return
        if prompt.turn_ends:
            await self._conversation(job, prompt)
            return
        completion = await self._answer(job, prompt)
        if completion is None or await self._dropped(job, prompt, completion):
            return
        await self._stage(job, prompt, completion)

    async def _conversation(self, job: _Job, prompt: Prompt) -> None:
        """Every turn in order, each request holding the answers before it; one seat of the window for
        the whole conversation (so that the turns of the conversations begun go before new ones), taken
        before any new one's when the conversation resumes at a kept turn. Each finished turn but the
        last is kept with the run (`keep_turns`) while the next turn is already asked (`TurnSaves`): a
        later delivery resumes at the next turn. The conversation is staged whole, once, after its last
        turn, or after a turn truncated in thinking (the turns after it would answer a broken one), once
        its turns' saves have landed and its seat is free for the next request."""
        saves = TurnSaves(lambda turns: self._in_thread(job.handover.keep_turns, prompt.id, turns))
        try:
            whole = await self._turns(job, prompt, saves)
        finally:
            await saves.settled()
        if whole is not None:
            await self._stage(job, prompt, whole)

    async def _turns(self, job: _Job, prompt: Prompt, saves: TurnSaves) -> Completion | None:
        """The conversation's turns from the first not kept, in its seat: the completion to stage (its
        last turn's, holding those before), or None once it is dead-lettered or left pending."""
        finished = list(job.kept_turns.get(prompt.id, []))
        count = prompt.turn_count
        async with self._conversation_seat(alone=prompt.id in job.suspects, resumed=bool(finished)):
            for index in range(len(finished), count):
                job.turn_at[prompt.id] = (index + 1, count)
                request = msgspec.structs.replace(
                    prompt, messages=prompt.request_messages([t.content for t in finished]), turn_ends=[]
                )
                completion = await self._answer(job, request)
                if completion is None or await self._dropped(job, prompt, completion):
                    return None
                if index == count - 1 or completion.quality is Quality.TRUNCATED_IN_THINKING:
                    return msgspec.structs.replace(
                        completion, earlier_turns=finished, conversation_turns=count
                    )
                finished.append(completion.as_turn())
                saves.keep(finished)
        return None

    async def _stage(self, job: _Job, prompt: Prompt, completion: Completion) -> None:
        """Hand the completion over; one past the record limit is dead-lettered (it would never commit)."""
        try:
            staged = await self._hand_over(job.handover.stage, completion, job.outcome, dead=False)
        except RecordTooLarge as error:
            await self._dead_letter(job, prompt, REASON_TOO_LARGE, str(error), attempts=completion.attempt)
            return
        if staged:
            tokens = completion.output_tokens()
            job.outcome.output_tokens += tokens
            self.recent_output.record(tokens)

    async def _dropped(self, job: _Job, prompt: Prompt, completion: Completion) -> bool:
        """Dead-letter a completion truncated in thinking when the run's policy drops those."""
        if (
            completion.quality is not Quality.TRUNCATED_IN_THINKING
            or job.truncation.policy is not TruncationPolicy.DROP
        ):
            return False
        await self._dead_letter(
            job,
            prompt,
            REASON_TRUNCATED,
            f"thinking cut off at max_tokens={completion.sampling.max_tokens}",
            attempts=completion.attempt,
        )
        return True

    async def _answer(self, job: _Job, prompt: Prompt) -> Completion | None:
        """One request's answer within the retry policy, its budget grown while thinking is cut off when
        the policy retries; None once the prompt is dead-lettered or left pending."""
        completion = await self._attempts(job, prompt, job.sampling, 0)
        while completion is not None and completion.quality is Quality.TRUNCATED_IN_THINKING:
            larger = await self._retry_budget(job, completion)
            if larger is None:
                break
            retry = msgspec.structs.replace(completion.sampling, max_tokens=larger)
            try:
                retried = await self._attempts(job, prompt, retry, completion.budget_retries + 1)
            except (InferenceRejected, InferenceUnavailable) as error:  # keep what we have
                log.warning(
                    "prompt %s: budget retry at max_tokens=%d refused or unanswered, keeping the "
                    "completion of max_tokens=%d: %s",
                    prompt.id,
                    larger,
                    completion.sampling.max_tokens,
                    error,
                )
                break
            completion = retried
        return completion

    async def _retry_budget(self, job: _Job, truncated: Completion) -> int | None:
        """The budget to ask again with for a completion cut off in thinking; None: keep it as it is.

        The server's context length is asked for only when the policy and the cap allow a retry."""
        if job.truncation.next_budget(truncated.sampling.max_tokens) is None:
            return None
        return job.truncation.next_budget(
            truncated.sampling.max_tokens,
            prompt_tokens=truncated.usage.prompt_tokens,
            context_length=await self._server_context_length(),
        )

    async def _server_context_length(self) -> int | None:
        """The server's context length, asked once at first need and shared by every prompt waiting
        for it; None when the client or the server does not say. A failed lookup is not kept: the
        retry at hand goes by the cap alone and the next need asks again."""
        if not isinstance(self._client, StatesContextLength):
            return None
        if self._context_length_lookup is None:
            self._context_length_lookup = asyncio.ensure_future(self._client.context_length())
        lookup = self._context_length_lookup
        try:
            return await asyncio.shield(lookup)
        except InferenceUnavailable as error:
            if self._context_length_lookup is lookup:
                self._context_length_lookup = None
            log.warning("the server's context length is unknown for now: %s", error)
            return None

    async def _attempts(
        self, job: _Job, prompt: Prompt, sampling: SamplingSettings, budget_retries: int
    ) -> Completion | None:
        """One answer within the retry policy; None once the prompt is dead-lettered or left pending.

        A suspect of poison is tried alone (`Tribunal.trial`) on each attempt; any other prompt whose request
        the server received and did not answer becomes more suspect (`Tribunal.suspect`). A budget retry
        (`budget_retries` > 0) is neither: it is never dead-lettered nor left pending, its refusal or
        failure is raised, and the caller keeps the completion it already had."""
        outcome, run = job.outcome, job.run
        last_error: InferenceUnavailable | None = None
        for attempt in range(1, self._retry.max_attempts + 1):
            rid = f"{run}:{prompt.id}:{uuid.uuid4().hex[:8]}"
            on_trial = prompt.id in job.suspects and not budget_retries
            try:
                if on_trial:
                    result = await self._trial(job, prompt, sampling, rid)
                else:
                    result = await self._chat(job, prompt, sampling, rid, alone=prompt.id in job.suspects)
            except ProvenPoison as proven:
                await self._dead_letter_poison(job, prompt, proven.evidence)
                return None
            except InferenceRejected as error:
                if budget_retries:
                    raise  # a refused budget retry: the caller keeps the completion it had
                await self._dead_letter(job, prompt, REASON_REJECTED, str(error), attempts=attempt)
                return None
            except InferenceUnavailable as error:
                last_error = error
                if not on_trial and not budget_retries:
                    verdict = await self._tribunal.suspect(job, prompt.id, error)
                    if verdict is Verdict.DEAD:  # other workers' convictions, and its worker died since
                        await self._dead_letter_poison(job, prompt, job.evidence[prompt.id])
                        return None
                if self._stop_reason(job) is not None or (
                    error.cause is FailureCause.ABANDONED and not on_trial
                ):
                    break  # (a trial waited for the server to come back: the next one may follow at once)
                log.warning(
                    "prompt %s attempt %d/%d: %s", prompt.id, attempt, self._retry.max_attempts, error
                )
                if attempt < self._retry.max_attempts:
                    await asyncio.sleep(
                        backoff_delay_s(
                            attempt, base_s=self._retry.backoff_base_s, cap_s=self._retry.backoff_cap_s
                        )
                    )
                continue
            self._steadiness.served(self._loop.time())
            return build_completion(prompt, result, sampling, self.origin, attempt, budget_retries)
        assert last_error is not None
        if budget_retries:
            raise last_error  # a budget retry that got no answer: the caller keeps the completion it had
        outcome.last_error = str(last_error)
        if last_error.server_unreachable or self._stop_reason(job) is not None:
            outcome.unreachable.append(prompt.id)
            return None
        await self._dead_letter(
            job, prompt, REASON_EXHAUSTED, str(last_error), attempts=self._retry.max_attempts
        )
        return None

    def _life(self) -> str:
        return f"{gpu_label(self.origin)}#{self._server_identity}.{self._steadiness.lives}"

    def _given_up(self, job: _Job) -> str | None:
        """Why this worker gives the job's prompts up (stopping, lease lost), a suspension aside."""
        if self._draining:
            return "worker shutting down"
        if not job.still_held():
            return "batch lease lost"
        return None

    async def _trial(self, job: _Job, prompt: Prompt, sampling: SamplingSettings, rid: str) -> ChatResult:
        return await self._tribunal.trial(
            job,
            prompt.id,
            lambda watch, signs: self._send(job, prompt, sampling, rid, watch, signs),
            stop_reason=lambda: self._stop_reason(job),
            given_up=lambda: self._given_up(job),
        )

    async def _dead_letter_poison(self, job: _Job, prompt: Prompt, evidence: list[Evidence]) -> None:
        error = describe(evidence, self._poison)
        log.error("prompt %s is dead-lettered as a poison prompt: %s", prompt.id, error)
        tried = sum(1 for e in evidence if isinstance(e, TrialEnded))
        await self._dead_letter(job, prompt, REASON_POISON, error, attempts=tried)

    async def _dead_letter(
        self, job: _Job, prompt: Prompt, reason: str, error: str, *, attempts: int
    ) -> None:
        """The prompt will get no completion: its dead letter goes to the upload path with the reason. A
        conversation's names the turn that failed; the whole conversation goes with it."""
        turn, count = job.turn_at.get(prompt.id, (0, 0))
        letter = DeadLetter(
            prompt_id=prompt.id,
            row=prompt.row,
            file=prompt.file,
            reason=reason,
            error=f"turn {turn} of {count}: {error}" if turn else error,
            attempts=attempts,
            turn=turn,
        )
        await self._hand_over(job.handover.dead_letter, letter, job.outcome, dead=True)

    async def _chat(
        self, job: _Job, prompt: Prompt, sampling: SamplingSettings, rid: str, *, alone: bool = False
    ) -> ChatResult:
        seated = prompt.id in job.turn_at and not alone
        async with self._slot(alone=alone, seated=seated):
            return await self._send(job, prompt, sampling, rid, self._silence)

    async def _send(
        self,
        job: _Job,
        prompt: Prompt,
        sampling: SamplingSettings,
        rid: str,
        watch: SilenceWatch,
        signs: list[float] | None = None,
    ) -> ChatResult:
        """Send the request, in a slot the caller holds, guarded by `watch`; the time of each of its chunks
        is appended to `signs` when given. AbandonedInFlight when the engine gives it up."""
        stop_reason = self._stop_reason(job)
        if stop_reason is not None:
            raise InferenceUnavailable(f"not sent: {stop_reason}", cause=FailureCause.ABANDONED)
        job.mark_sent(prompt.id)

        def start(on_progress: ProgressCallback) -> Awaitable[ChatResult]:
            if signs is None:
                return self._client.chat(prompt.messages, sampling, rid, on_progress)

            def noted() -> None:
                signs.append(self._loop.time())
                on_progress()

            return self._client.chat(prompt.messages, sampling, rid, noted)

        task = asyncio.ensure_future(watch.guard(rid, sampling, start))
        self._in_flight.add(task)
        self._idle.clear()
        try:
            return await task
        except asyncio.CancelledError:
            if self._suspended_because is None or not task.cancelled():
                raise
            raise AbandonedInFlight(self._suspended_because, self._outage) from None
        finally:
            self._in_flight.discard(task)
            if not self._in_flight:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def _conversation_seat(self, *, alone: bool, resumed: bool) -> AsyncIterator[None]:
        """A window slot a conversation holds from its first turn to its last, before any new one's when
        it is `resumed` at a kept turn (a suspect's turns each take the whole server instead, see _slot)."""
        if alone:
            yield
            return
        await self._window.acquire(first=resumed)
        try:
            yield
        finally:
            self._window.release()

    @contextlib.asynccontextmanager
    async def _slot(self, *, alone: bool, seated: bool = False) -> AsyncIterator[None]:
        """One of the window's slots; or, for a suspect, the whole server: it waits for every request
        in flight to end, and nothing else is sent until it ends (nor until the next suspect waiting has
        had its turn), so that its failure tells. A request `seated` in a slot its conversation holds
        waits only for the suspects to finish."""
        if seated:
            await self._nobody_alone.wait()
            yield
            return
        if not alone:
            while True:
                await self._nobody_alone.wait()
                await self._window.acquire()
                if self._nobody_alone.is_set():
                    break
                self._window.release()  # a suspect came first: let it have the server
            try:
                yield
            finally:
                self._window.release()
            return
        self._suspects_waiting += 1
        try:
            await self._alone_lock.acquire()
        finally:
            self._suspects_waiting -= 1
        try:
            self._nobody_alone.clear()
            await self._idle.wait()
            yield
        finally:
            if not self._suspects_waiting:  # suspects waiting go one after the other, with no drain between
                self._nobody_alone.set()
            self._alone_lock.release()

    async def _in_thread(self, call: Callable[..., T], *args: Any) -> T:
        """A blocking call to the run's state, on the hand-over threads (never behind another's write)."""
        return await self._loop.run_in_executor(self._handover_threads, call, *args)

    async def _hand_over(
        self, write: Callable[[R], bool], record: R, outcome: BatchOutcome, *, dead: bool
    ) -> bool:
        """Write the record and count it; whether it was written (False: the prompt had one already)."""
        if not await self._in_thread(write, record):
            outcome.already_handled += 1
            return False
        if dead:
            outcome.dead_lettered += 1
        else:
            outcome.staged += 1
        return True

    def close(self) -> None:
        self._call(self._silence.close())
        self._call(self._tribunal.trial_silence.close())
        self._call(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._handover_threads.shutdown(wait=False, cancel_futures=True)
