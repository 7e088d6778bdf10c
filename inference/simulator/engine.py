"""The throughput model: a continuous-batching scheduler in virtual ("model") time.

Model time runs at `speedup` model seconds per wall second. Requests wait in a FIFO queue and are
admitted, up to `max_running_requests`, in prefill batches (time: base per chunk of at most
`chunked_prefill_size` new tokens + per new token; decoding pauses meanwhile, as SGLang runs a prefill
batch instead of a decode step). A prompt's new tokens are those not in the server's prefix cache
(`radix_cache.py`): a prefilled prompt is cached at once, a finished request's prompt and output when it
ends, within the KV pool left over by the running requests. Every decode step takes
`base + per_request * running` and gives each running request `accept_length` tokens on average
(exactly: `1 + floor(steps * accept_length)` tokens after `steps` verifies, the first token coming
from prefill).

A request may be retracted, as SGLang's scheduler retracts requests when the KV pool runs out: taken
out of the running batch after its first token and put back in the queue after a pause (its stream
silent meanwhile), then prefilled again with what it produced so far and continued. Here it is a prompt
fault (`retract`), and only under load: a request running alone is never retracted.

The engine never sleeps once per step. On each wake-up it commits, in bulk, every step that has
ended by now, stopping only at events (a request finishing, a queued request becoming admissible),
then sleeps until the next event is due: a request's completion, a prefill's end, or the next
write to a running stream (at most one per `stream_min_interval_wall_s`; a stream writes the chunks of
every step since its last write, `stream_cuts`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import heapq
import itertools
import math
from collections.abc import Sequence

from inference.simulator.radix_cache import RadixCache
from inference.simulator.scheduler_log import SchedulerLog
from inference.simulator.settings import SimulatorSettings

WAKE_EPSILON_WALL_S = 1e-6
STEP_COUNT_EPSILON = 1e-9


class QueueFullError(Exception):
    """The waiting queue has reached --max-queued-requests."""


class Phase(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass(eq=False, slots=True)
class SimRequest:
    """One request as the scheduler sees it: a prompt length and a number of tokens to produce."""

    prompt_tokens: int
    target_tokens: int
    streaming: bool
    prompt_ids: Sequence[int] = ()  # the prompt as token ids: its prefix-cache key
    cached_tokens: int = 0  # of the prompt, found in the prefix cache at its (last) admission
    stalled: bool = False  # admitted and given its first token, then never another (a prompt fault)
    retract_pause_wall_s: float = 0.0  # under load, retracted once after its first token for this long
    retracted: bool = False
    base_tokens: int = 0  # produced before a retraction: a resumed request continues from there
    arrival_model_s: float = 0.0
    arrival_wall_s: float = 0.0
    phase: Phase = Phase.WAITING
    aborted: bool = False
    reported_finished: bool = True
    """Whether the scheduler reports its end as a finished request (SGLang's batch output, which counts it
    in `num_requests_total`): not one aborted in the waiting queue (answered with an abort echo), nor any
    aborted while the scheduler hangs (it answers nothing)."""
    start_step: int = 0
    finish_step: int = 0
    final_tokens: int = 0
    verify_count: int = 0
    admitted_wall_s: float | None = None
    first_token_model_s: float | None = None  # the end of its (first) prefill, in model time
    first_token_wall_s: float | None = None
    finished_wall_s: float | None = None
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    progress: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


@dataclasses.dataclass(slots=True)
class _Window:
    """Decode statistics since the last decode log line."""

    steps: int = 0
    tokens: int = 0
    verifies: int = 0
    model_s: float = 0.0


class Engine:
    """The scheduler. Create it inside the running loop, then run `run()` as a task."""

    def __init__(self, settings: SimulatorSettings, log: SchedulerLog) -> None:
        self._settings = settings
        self._log = log
        fraction = settings.accept_length_fraction
        self._accept_num, self._accept_den = fraction.numerator, fraction.denominator
        self._loop = asyncio.get_running_loop()
        self._origin_wall_s = self._loop.time()
        self._running: set[SimRequest] = set()
        self._heap: list[tuple[int, int, SimRequest]] = []
        self._waiting: collections.deque[SimRequest] = collections.deque()
        self._sequence = itertools.count()
        self._step = 0
        self._engine_time_s = 0.0
        self._hung = False  # --server-hang takes hold once the warm-up has run (server.serve)
        self._closed = False
        self._wake = asyncio.Event()
        self._window = _Window()
        self.gen_throughput = 0.0
        self.accept_length = 0.0
        self.total_verifies = 0
        self.total_decode_tokens = 0  # every token but each request's first, which prefill produces
        self.total_prefill_tokens = 0  # prompt tokens computed (not found in the prefix cache)
        self.total_cached_tokens = 0  # prompt tokens found in the prefix cache
        self.cache_hit_rate = 0.0  # of the last prefill batch, as SGLang's gauge
        self.cache = None if settings.disable_radix_cache else RadixCache()
        self._next_output_id = 0  # output tokens are cached as fresh negative ids, below this one
        self.retracted_waiting = 0  # retracted and not back in the queue yet
        self.total_retracted = 0

    # ----- time -----
    def model_now(self) -> float:
        return (self._loop.time() - self._origin_wall_s) * self._settings.speedup

    def _tokens_after(self, request: SimRequest, steps: int) -> int:
        if request.target_tokens == 0:
            return 0
        if request.stalled:
            return 1
        return min(
            request.target_tokens, request.base_tokens + 1 + steps * self._accept_num // self._accept_den
        )

    def _steps_needed(self, target_tokens: int) -> int:
        if target_tokens <= 1:
            return 0
        return -(-(target_tokens - 1) * self._accept_den // self._accept_num)

    # ----- public state -----
    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def hung(self) -> bool:
        return self._hung

    def produced(self, request: SimRequest) -> int:
        if request.phase is Phase.RUNNING:
            return self._tokens_after(request, self._step - request.start_step)
        return request.final_tokens if request.phase is Phase.FINISHED else request.base_tokens

    def stream_cuts(self, request: SimRequest, sent: int) -> list[int]:
        """Where SGLang's chunks end among the tokens produced since the first `sent`: the first token
        (prefill) at once, then after every decode step (`stream_interval` 1), or whenever at least
        `stream_interval` tokens are unsent; a finished request's last tokens in a chunk of their own."""
        produced = self.produced(request)
        if produced <= sent:
            return []
        if request.phase is Phase.WAITING:  # retracted: what it produced before went out at its steps
            return [produced]
        steps = self._step - request.start_step if request.phase is Phase.RUNNING else request.verify_count
        interval = self._settings.stream_interval
        first_step = max(0, (sent - request.base_tokens - 1) * self._accept_den // self._accept_num)
        cuts: list[int] = []
        last = sent
        for step in range(first_step, steps + 1):
            tokens = min(self._tokens_after(request, step), produced)
            if tokens > last and (interval == 1 or tokens - last >= interval or last == 0):
                cuts.append(tokens)
                last = tokens
        if last < produced and request.phase is Phase.FINISHED:
            cuts.append(produced)
        return cuts

    def kv_tokens(self) -> int:
        return sum(request.prompt_tokens + self.produced(request) for request in self._running)

    def cached_size_tokens(self) -> int:
        return self.cache.size_tokens if self.cache is not None else 0

    def token_usage(self) -> float:
        return round(self.kv_tokens() / self._settings.max_total_tokens, 2)

    def mamba_usage(self) -> float:
        return round(len(self._running) / self._settings.max_running_requests, 2)

    def avg_accept_length(self) -> float:
        """Tokens per verify over the last decode-log window, else since start (0 before any decode)."""
        if self.accept_length:
            return self.accept_length
        return self.total_decode_tokens / self.total_verifies if self.total_verifies else 0.0

    def accept_rate(self) -> float:
        drafts = self._settings.speculative_num_draft_tokens - 1
        accept_length = self.avg_accept_length()
        return max(0.0, accept_length - 1) / drafts if drafts > 0 and accept_length else 0.0

    # ----- commands -----
    def submit(self, request: SimRequest) -> None:
        limit = self._settings.max_queued_requests
        if limit is not None and len(self._waiting) >= limit:
            raise QueueFullError("The request queue is full.")
        request.arrival_model_s = self.model_now()
        request.arrival_wall_s = self._loop.time()
        self._waiting.append(request)
        self._wake.set()

    def catch_up(self) -> None:
        """Commit every step that has ended by now, as a GPU scheduler would have run it.

        The engine sleeps between events (a request's end, a prefill's end, a stream chunk), so without
        this a long non-streaming request shows no progress until it ends."""
        self._advance(self.model_now())
        self._wake.set()  # the run loop recomputes its next wake-up from the new state

    def abort(self, request: SimRequest) -> None:
        """Stop a request where it is (client gone, /abort_request); its tokens so far are kept."""
        self.catch_up()
        if request.phase is Phase.FINISHED:
            return
        if request.phase is Phase.WAITING:
            if request in self._waiting:
                self._waiting.remove(request)
            elif request.retracted:
                self.retracted_waiting -= 1  # aborted during its pause: it never comes back
            else:
                return  # never submitted
        else:
            self._running.discard(request)
        verifies = self._step - request.start_step if request.phase is Phase.RUNNING else 0
        request.aborted = True
        request.reported_finished = request.phase is Phase.RUNNING and not self._hung
        self._finish(request, self.produced(request), verifies)
        self._evict_cache()
        self._wake.set()

    def set_hung(self, hung: bool) -> None:
        """A hung engine produces no token; on resume, the hung period is skipped, not caught up."""
        if self._hung and not hung:
            self._engine_time_s = max(self._engine_time_s, self.model_now())
        self._hung = hung
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    async def run(self) -> None:
        while not self._closed:
            self._wake.clear()
            wake_at = self._advance(self.model_now())
            timer = None
            if wake_at is not None:
                delay = max(0.0, wake_at - self.model_now()) / self._settings.speedup + WAKE_EPSILON_WALL_S
                timer = self._loop.call_later(delay, self._wake.set)
            await self._wake.wait()
            if timer is not None:
                timer.cancel()

    # ----- the scheduler -----
    def _advance(self, now: float) -> float | None:
        """Commit every event that has happened by `now`; return the model time of the next one."""
        if self._hung:
            return None
        start_step = self._step
        try:
            return self._advance_until(now)
        finally:
            if self._step != start_step:
                for request in self._running:
                    if request.streaming and not request.stalled:
                        request.progress.set()

    def _advance_until(self, now: float) -> float | None:
        settings = self._settings
        while True:
            if not self._running:
                if not self._waiting:
                    self._engine_time_s = max(self._engine_time_s, now)
                    return None
                self._engine_time_s = max(self._engine_time_s, self._waiting[0].arrival_model_s)
            free_slots = settings.max_running_requests - len(self._running)
            if free_slots > 0 and self._waiting and self._waiting[0].arrival_model_s <= self._engine_time_s:
                batch = self._prefill_batch(free_slots)
                new_tokens = sum(request.prompt_tokens - request.cached_tokens for request in batch)
                chunks = max(1, -(-new_tokens // settings.chunked_prefill_size))
                duration = settings.prefill_base_s * chunks + settings.prefill_per_token_s * new_tokens
                if self._engine_time_s + duration > now:
                    return self._engine_time_s + duration
                self._engine_time_s += duration
                self._commit_prefill(batch, new_tokens, duration)
                continue
            step_s = settings.decode_step_s(len(self._running))
            steps_to_finish = self._steps_to_next_finish()
            if steps_to_finish == 0:
                self._finish_due()
                continue
            steps_to_arrival = math.inf
            if free_slots > 0 and self._waiting:
                wait_s = self._waiting[0].arrival_model_s - self._engine_time_s
                steps_to_arrival = max(1, math.ceil(wait_s / step_s))
            steps_available = math.floor((now - self._engine_time_s) / step_s + STEP_COUNT_EPSILON)
            steps = min(steps_to_finish, steps_to_arrival, steps_available)
            if steps <= 0:
                return self._engine_time_s + step_s * min(
                    steps_to_finish, steps_to_arrival, self._steps_per_stream_chunk(step_s)
                )
            self._commit_steps(int(steps), step_s)

    def _prefill_batch(self, free_slots: int) -> list[SimRequest]:
        """The queue's head that one prefill takes: arrived requests in order, up to the free slots, while
        their new tokens fit `chunked_prefill_size`; the first that does not fit ends the batch, chunked
        (its chunks run back to back, decoding paused, as SGLang prefers prefill to decode)."""
        batch: list[SimRequest] = []
        budget = self._settings.chunked_prefill_size
        for request in itertools.islice(self._waiting, free_slots):
            if request.arrival_model_s > self._engine_time_s or (batch and budget <= 0):
                break
            request.cached_tokens = self._match_prefix(request)
            batch.append(request)
            budget -= request.prompt_tokens - request.cached_tokens
        return batch

    def _match_prefix(self, request: SimRequest) -> int:
        """Prompt tokens in the prefix cache; at least the last one is computed, as in SGLang."""
        if self.cache is None or not request.prompt_ids:
            return 0
        return min(self.cache.match_prefix(request.prompt_ids), request.prompt_tokens - 1)

    def _cache_tokens(self, ids: Sequence[int]) -> None:
        """Insert `ids` in the prefix cache (`_evict_cache` then keeps it within its room)."""
        if self.cache is not None and ids:
            self.cache.insert(ids)

    def _evict_cache(self) -> None:
        """Keep the prefix cache within what the running requests leave of the KV pool: once after the
        inserts of a prefill batch or of the requests finishing together (each eviction walks the tree)."""
        if self.cache is not None:
            self.cache.evict(max(0, self._settings.max_total_tokens - self.kv_tokens()))

    def _cache_finished(self, request: SimRequest) -> None:
        """Cache the prompt and the output. The simulator's template renders an earlier answer without its
        `<think>` block, so no later prompt continues into an output: its ids only have to take their
        room in the cache, and unique stand-ins (cheaper than the real ids) do that."""
        if request.admitted_wall_s is None or not request.prompt_ids:
            return  # never prefilled (nothing of it is on the GPU), or not cached
        end, self._next_output_id = self._next_output_id, self._next_output_id - request.final_tokens
        self._cache_tokens([*request.prompt_ids, *range(self._next_output_id, end)])

    def flush_cache(self) -> None:
        if self.cache is not None:
            self.cache.clear()

    def _steps_to_next_finish(self) -> float:
        while self._heap and not self._due_entry(*self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] - self._step if self._heap else math.inf

    @staticmethod
    def _due_entry(finish_step: int, _sequence: int, request: SimRequest) -> bool:
        """A heap entry still stands for its request (not a retracted request's earlier admission)."""
        return request.phase is Phase.RUNNING and finish_step == request.finish_step

    def _steps_per_stream_chunk(self, step_s: float) -> float:
        if not any(request.streaming and not request.stalled for request in self._running):
            return math.inf
        interval_model_s = self._settings.stream_min_interval_wall_s * self._settings.speedup
        return max(1, math.floor(interval_model_s / step_s))

    def _commit_prefill(self, batch: list[SimRequest], new_tokens: int, duration_s: float) -> None:
        now_wall = self._loop.time()
        for request in batch:
            self._waiting.popleft()  # the batch is a prefix of the FIFO queue
            request.phase = Phase.RUNNING
            request.start_step = self._step
            if request.admitted_wall_s is None:
                request.admitted_wall_s = request.first_token_wall_s = now_wall
                request.first_token_model_s = self._engine_time_s
            request.finish_step = self._step + self._steps_needed(request.target_tokens - request.base_tokens)
            self._running.add(request)
            if not request.stalled:  # a stalled request holds its slot until it is aborted
                heapq.heappush(self._heap, (request.finish_step, next(self._sequence), request))
            request.progress.set()
        for request in batch:
            self._cache_tokens(request.prompt_ids)
        self._evict_cache()
        for request in batch:
            if request.retract_pause_wall_s and not request.retracted and len(self._running) > 1:
                self._retract(request)
        cached_tokens = sum(request.cached_tokens for request in batch)
        self.total_prefill_tokens += new_tokens
        self.total_cached_tokens += cached_tokens
        self.cache_hit_rate = (
            cached_tokens / (cached_tokens + new_tokens) if cached_tokens + new_tokens else 0.0
        )
        throughput = new_tokens / duration_s * self._settings.speedup if duration_s > 0 else 0.0
        if self._log.due("prefill"):
            self._log.prefill(
                new_seq=len(batch),
                new_token=new_tokens,
                cached_token=cached_tokens,
                token_usage=self.token_usage(),
                mamba_usage=self.mamba_usage(),
                running=len(self._running),
                queued=len(self._waiting),
                input_throughput=throughput,
            )

    def _commit_steps(self, steps: int, step_s: float) -> None:
        tokens = sum(
            self._tokens_after(r, self._step + steps - r.start_step)
            - self._tokens_after(r, self._step - r.start_step)
            for r in self._running
        )
        self._step += steps
        self._engine_time_s += steps * step_s
        verifies = steps * len(self._running)
        self.total_verifies += verifies
        self.total_decode_tokens += tokens
        window = self._window
        window.steps += steps
        window.tokens += tokens
        window.verifies += verifies
        window.model_s += steps * step_s
        self._finish_due()
        if window.steps >= self._settings.decode_log_interval:
            self._close_window()

    def _close_window(self) -> None:
        window = self._window
        self.gen_throughput = (
            window.tokens / window.model_s * self._settings.speedup if window.model_s else 0.0
        )
        self.accept_length = window.tokens / window.verifies if window.verifies else 0.0
        if self._log.due("decode"):
            self._log.decode(
                running=len(self._running),
                tokens=self.kv_tokens(),
                token_usage=self.token_usage(),
                mamba_usage=self.mamba_usage(),
                accept_length=self.accept_length,
                accept_rate=self.accept_rate(),
                gen_throughput=self.gen_throughput,
                queued=len(self._waiting),
            )
        self._window = _Window()

    def _retract(self, request: SimRequest) -> None:
        """Take a request out of the running batch with what it produced; it is queued again after its
        pause (SGLang's `retract_decode`, here on a prompt fault)."""
        request.base_tokens = self._tokens_after(request, self._step - request.start_step)
        self._running.discard(request)
        request.phase = Phase.WAITING
        request.retracted = True
        self.retracted_waiting += 1
        self.total_retracted += 1
        self._loop.call_later(request.retract_pause_wall_s, self._requeue, request)

    def _requeue(self, request: SimRequest) -> None:
        if request.phase is not Phase.WAITING or request.aborted:
            return
        self.retracted_waiting -= 1
        arrival = self.model_now()
        if self._waiting:  # first in line, as the oldest request waiting; the queue stays in arrival order
            arrival = min(arrival, self._waiting[0].arrival_model_s)
        request.arrival_model_s = arrival
        self._waiting.appendleft(request)
        self._wake.set()

    def _finish_due(self) -> None:
        finished = False
        while self._heap and self._heap[0][0] <= self._step:
            entry = heapq.heappop(self._heap)
            request = entry[2]
            if self._due_entry(*entry):
                self._running.discard(request)
                steps = self._step - request.start_step
                self._finish(request, self._tokens_after(request, steps), steps)
                finished = True
        if finished:
            self._evict_cache()

    def _finish(self, request: SimRequest, tokens: int, verifies: int) -> None:
        request.phase = Phase.FINISHED
        request.final_tokens = tokens
        request.verify_count = max(0, verifies)
        request.finished_wall_s = self._loop.time()
        self._cache_finished(request)
        request.done.set()
        request.progress.set()
