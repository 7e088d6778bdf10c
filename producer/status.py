"""A run's status, from Redis alone: progress, rates, ETA, cost, a row per GPU, queues, upload backlog,
dead letters, quality and the gate, and the pause state.

`gather_status` does all the reading; every figure is a pure function of the values read and of
`now` (Redis's clock, the one the event ids and staged scores use), so each is unit-tested with a
fake clock. Figures come from completed work recorded in Redis, never from server logs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import redis

from inference.records import Quality, Record
from producer.errors import RunNotFound
from workers.control import pause_state
from workers.heartbeat import WorkerHeartbeat, read_heartbeats
from workers.keys import RunKeys
from workers.manifest import decode_entry
from workers.quality_gate import DROPPED_TRUNCATIONS, GateReading, read_gate
from workers.queues import GENERATE_QUEUE, KOMBU_UNACKED_KEY, QUEUES
from workers.runs import RunSettings, decode_run_settings
from workers.stats_fields import (
    COMPLETION_TOKENS,
    COMPLETIONS,
    DEAD_PREFIX,
    FINISH_PREFIX,
    FIRST_COMPLETION_AT,
    TOKEN_IDS_MISSING,
    quality_field,
)

RATE_WINDOW_S = 60.0  # "recent" rates: completions of the last minute
MIN_COMPLETIONS_FOR_ETA = 20  # fewer in the window and the rate is noise: the ETA says "unknown"
GPU_SAMPLE_EVENTS = 5_000  # most recent completions read to learn which GPUs served the run
SECONDS_PER_HOUR = 3600.0
MS_PER_S = 1000.0
MICROSECONDS_PER_S = 1e6
UNACKED_SCAN_COUNT = 1000
QUALITY_SHOWN = (
    Quality.EMPTY_ANSWER,
    Quality.TRUNCATED_IN_THINKING,
    Quality.TRUNCATED_IN_ANSWER,
    Quality.NO_REASONING,
)
IN_FLIGHT_NOTE = (
    "in flight = delivered to a worker and not yet acknowledged (running, prefetched, or held for a "
    "retry countdown), all runs together; Flower's Broker tab shows only the waiting ones"
)

STATE_WAITING = "waiting for the first completion"
STATE_RUNNING = "running"
STATE_PAUSED = "paused"
STATE_UPLOADING = "generated; uploading the rest"
STATE_FINISHED = "finished"


# ---------------------------------------------------------------- the snapshot


class Progress(Record, frozen=True):
    enqueued: int  # the total: every prompt accepted into the run
    committed: int  # in an object listed in the manifest
    staged: int  # generated, awaiting upload
    dead_lettered: int
    rejected_rows: int  # refused at enqueue, never part of `enqueued`
    remaining: int  # still to generate
    committed_fraction: float


class Rates(Record, frozen=True):
    window_s: float
    completions: int
    output_tokens: int
    completions_per_s: float
    output_tokens_per_s: float


class Throughput(Record, frozen=True):
    last_minute: Rates
    whole_run: Rates
    mean_output_tokens: float | None
    first_completion_at: float | None  # Redis clock, unix seconds
    last_completion_at: float | None


class Eta(Record, frozen=True):
    seconds: float | None  # None: unknown, see `basis`
    finishes_at: float | None  # unix seconds
    basis: str


class Cost(Record, frozen=True):
    gpus: int
    elapsed_s: float
    gpu_hours: float
    projected_gpu_hours: float | None
    price_per_gpu_hour: float | None
    so_far_usd: float | None
    projected_total_usd: float | None
    assumption: str


class GpuRow(Record, frozen=True):
    worker: str  # host/gpuN
    output_tokens_per_s: float  # this run's, over the last minute
    completions_last_minute: int
    in_flight: int | None  # None: no live heartbeat
    max_in_flight: int | None
    spec_accept_length: float | None
    server_health: int | None  # HTTP status of /health
    suspended: bool | None
    heartbeat_age_s: float | None


class QueueDepth(Record, frozen=True):
    queue: str
    waiting: int
    in_flight: int


class UploadBacklog(Record, frozen=True):
    staged: int
    staged_bytes: int
    oldest_staged_age_s: float | None
    objects_committed: int
    committed_bytes: int


class QualityFigures(Record, frozen=True):
    judged: int  # completions, plus truncations dropped by the run's policy
    counts: dict[str, int]
    rates: dict[str, float]
    finish_reasons: dict[str, int]


class GateFigures(Record, frozen=True):
    judged_since_resume: int
    min_completions: int
    empty_answer_rate: float
    max_empty_answer_rate: float
    truncated_rate: float
    max_truncated_rate: float
    failing: str | None  # what the gate would say now; None when healthy or too early
    truncated_thinking_policy: str


class PauseFigures(Record, frozen=True):
    reason: str
    by: str
    at: float
    for_s: float


class RunStatus(Record, frozen=True):
    run: str
    now: float  # Redis clock, unix seconds
    state: str
    progress: Progress
    throughput: Throughput
    eta: Eta
    cost: Cost
    gpus: list[GpuRow]
    queues: list[QueueDepth]
    queues_note: str
    upload: UploadBacklog
    dead_letters: dict[str, int]  # by reason
    quality: QualityFigures
    gate: GateFigures
    paused: PauseFigures | None
    warnings: list[str]


# ---------------------------------------------------------------- pure figures


@dataclass(frozen=True)
class Event:
    """One completion of the run's event stream."""

    at_s: float  # Redis clock
    tokens: int
    gpu: str


def stream_id_s(entry_id: bytes | str) -> float:
    """The time of a stream entry: its id is `<ms>-<seq>` on Redis's clock."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0]) / MS_PER_S


def parse_events(entries: Iterable[tuple[bytes, Mapping[bytes, bytes]]]) -> list[Event]:
    events = []
    for entry_id, fields in entries:
        tokens = fields.get(b"tokens", b"0")
        events.append(
            Event(
                at_s=stream_id_s(entry_id),
                tokens=int(tokens) if tokens.isdigit() else 0,
                gpu=fields.get(b"gpu", b"?").decode(errors="replace"),
            )
        )
    return events


def parse_counters(raw: Mapping[bytes, bytes]) -> dict[str, int]:
    """The integer fields of a stats hash (first_completion_at included)."""
    return {key.decode(): int(value) for key, value in raw.items() if value.lstrip(b"-").isdigit()}


def run_started_s(first_completion_at: int | None, oldest_event_s: float | None) -> float | None:
    """When the first completion landed: the oldest event's exact time while the stream still holds it,
    else the whole second recorded in stats."""
    if first_completion_at is None:
        return oldest_event_s
    if oldest_event_s is not None and int(oldest_event_s) == first_completion_at:
        return oldest_event_s
    return float(first_completion_at)


def rates_over(completions: int, output_tokens: int, window_s: float) -> Rates:
    if window_s <= 0:
        return Rates(
            window_s=0.0,
            completions=completions,
            output_tokens=output_tokens,
            completions_per_s=0.0,
            output_tokens_per_s=0.0,
        )
    return Rates(
        window_s=window_s,
        completions=completions,
        output_tokens=output_tokens,
        completions_per_s=completions / window_s,
        output_tokens_per_s=output_tokens / window_s,
    )


def recent_window_s(now_s: float, started_s: float | None, window_s: float = RATE_WINDOW_S) -> float:
    """The last `window_s`, shortened to the run's age while it is younger than that."""
    if started_s is None:
        return 0.0
    return max(0.0, min(window_s, now_s - started_s))


def events_in_window(events: Iterable[Event], *, now_s: float, window_s: float) -> list[Event]:
    """The events of [now - window_s, now]: none when the window is empty."""
    if window_s <= 0:
        return []
    return [event for event in events if now_s - window_s <= event.at_s <= now_s]


def window_rates(events: Sequence[Event], *, now_s: float, window_s: float) -> Rates:
    """Completions and output tokens per second over [now - window_s, now]."""
    inside = events_in_window(events, now_s=now_s, window_s=window_s)
    return rates_over(len(inside), sum(event.tokens for event in inside), max(window_s, 0.0))


def estimate_eta(remaining: int, recent: Rates, *, now_s: float, paused: bool) -> Eta:
    """Remaining prompts ÷ the recent completion rate."""
    if remaining <= 0:
        return Eta(seconds=0.0, finishes_at=now_s, basis="every prompt is generated")
    if paused:
        return Eta(seconds=None, finishes_at=None, basis="unknown while the run is paused")
    if recent.completions < MIN_COMPLETIONS_FOR_ETA or recent.completions_per_s <= 0:
        return Eta(
            seconds=None,
            finishes_at=None,
            basis=f"unknown until {MIN_COMPLETIONS_FOR_ETA} completions arrive within "
            f"{RATE_WINDOW_S:.0f} s ({recent.completions} so far)",
        )
    seconds = remaining / recent.completions_per_s
    return Eta(
        seconds=seconds,
        finishes_at=now_s + seconds,
        basis=f"{remaining} remaining ÷ {recent.completions_per_s:.2f} completions/s "
        f"over the last {recent.window_s:.0f} s",
    )


def estimate_cost(
    *, gpus: int, elapsed_s: float, eta_s: float | None, price_per_gpu_hour: float | None, price_source: str
) -> Cost:
    gpu_hours = gpus * elapsed_s / SECONDS_PER_HOUR
    projected = gpus * (elapsed_s + eta_s) / SECONDS_PER_HOUR if eta_s is not None else None
    assumption = (
        f"{gpus} GPUs (those in the run's recent completions or with a live heartbeat) × the time since "
        "the first completion, idle time included; assumes the GPUs serve this run alone"
    )
    if price_per_gpu_hour is None:
        assumption += "; no price given (--price-per-gpu-hour or $DRAFTGEN_PRICE_PER_GPU_HOUR)"
    else:
        assumption += f"; ${price_per_gpu_hour:.2f} per GPU-hour ({price_source})"
    return Cost(
        gpus=gpus,
        elapsed_s=elapsed_s,
        gpu_hours=gpu_hours,
        projected_gpu_hours=projected,
        price_per_gpu_hour=price_per_gpu_hour,
        so_far_usd=gpu_hours * price_per_gpu_hour if price_per_gpu_hour is not None else None,
        projected_total_usd=(
            projected * price_per_gpu_hour
            if projected is not None and price_per_gpu_hour is not None
            else None
        ),
        assumption=assumption,
    )


def gpu_rows(
    window_events: Sequence[Event],
    window_s: float,
    heartbeats: Sequence[WorkerHeartbeat],
    known_gpus: Iterable[str],
    *,
    now_s: float,
) -> list[GpuRow]:
    """A row per GPU that served the run recently or has a live heartbeat, sorted by label."""
    tokens: Counter[str] = Counter()
    completions: Counter[str] = Counter()
    for event in window_events:
        tokens[event.gpu] += event.tokens
        completions[event.gpu] += 1
    beats = {beat.worker: beat for beat in heartbeats}
    rows = []
    for worker in sorted(set(known_gpus) | set(tokens) | set(beats)):
        beat = beats.get(worker)
        rows.append(
            GpuRow(
                worker=worker,
                output_tokens_per_s=tokens[worker] / window_s if window_s > 0 else 0.0,
                completions_last_minute=completions[worker],
                in_flight=beat.in_flight if beat else None,
                max_in_flight=beat.max_in_flight if beat else None,
                spec_accept_length=beat.spec_accept_length if beat else None,
                server_health=beat.server_health if beat else None,
                suspended=beat.suspended if beat else None,
                heartbeat_age_s=max(0.0, now_s - beat.updated_at) if beat else None,
            )
        )
    return rows


def split_unacked(values: Iterable[bytes]) -> Counter[str]:
    """Messages in flight per routing key (= queue name), from kombu's `unacked` hash values."""
    per_queue: Counter[str] = Counter()
    for raw in values:
        try:
            _message, _exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        per_queue[str(routing_key)] += 1
    return per_queue


def quality_figures(counters: Mapping[str, int]) -> QualityFigures:
    """Rates over the completions, counting truncations a drop policy dead-lettered as truncated too."""
    dropped = counters.get(DROPPED_TRUNCATIONS, 0)
    judged = counters.get(COMPLETIONS, 0) + dropped
    counts = {label.value: counters.get(quality_field(label.value), 0) for label in QUALITY_SHOWN}
    counts[Quality.TRUNCATED_IN_THINKING.value] += dropped
    return QualityFigures(
        judged=judged,
        counts=counts,
        rates={label: count / judged if judged else 0.0 for label, count in counts.items()},
        finish_reasons={
            key.removeprefix(FINISH_PREFIX): value
            for key, value in sorted(counters.items())
            if key.startswith(FINISH_PREFIX)
        },
    )


def dead_letters_by_reason(counters: Mapping[str, int]) -> dict[str, int]:
    return {
        key.removeprefix(DEAD_PREFIX): value
        for key, value in sorted(counters.items())
        if key.startswith(DEAD_PREFIX)
    }


def gate_figures(reading: GateReading, settings: RunSettings) -> GateFigures:
    return GateFigures(
        judged_since_resume=reading.judged,
        min_completions=reading.gate.min_completions,
        empty_answer_rate=reading.empty_answer_rate,
        max_empty_answer_rate=reading.gate.max_empty_answer_rate,
        truncated_rate=reading.truncated_rate,
        max_truncated_rate=reading.gate.max_truncated_rate,
        failing=reading.failure,
        truncated_thinking_policy=settings.truncated_thinking.value,
    )


def run_state(progress: Progress, *, completions: int, paused: bool) -> str:
    if paused:
        return STATE_PAUSED
    if progress.enqueued > 0 and progress.remaining <= 0:
        return STATE_FINISHED if progress.staged == 0 else STATE_UPLOADING
    return STATE_RUNNING if completions > 0 or progress.committed or progress.dead_lettered else STATE_WAITING


def stranded_warning(progress: Progress, queues: Sequence[QueueDepth], *, paused: bool) -> str | None:
    """Prompts left to generate while no generate message exists anywhere: their messages are gone."""
    generate = [queue for queue in queues if queue.queue == GENERATE_QUEUE]
    if paused or progress.remaining <= 0 or any(queue.waiting or queue.in_flight for queue in generate):
        return None
    return (
        f"{progress.remaining:,} prompts are still to generate, but no generate message is waiting or in "
        "flight for any run: their batches' messages are gone and nothing will generate them"
    )


def token_ids_warning(counters: Mapping[str, int]) -> str | None:
    """Completions staged without their token ids: said once, with what it costs the export."""
    missing = counters.get(TOKEN_IDS_MISSING, 0)
    if not missing:
        return None
    return (
        f"{missing:,} of {counters.get(COMPLETIONS, 0):,} completions came without token ids: their server "
        "does not return them (SGLang older than 0.5.23). Their rows keep text only: `export --format "
        "speculators` cannot use them, and their loss tokens are estimated from usage"
    )


def make_progress(*, enqueued: int, committed: int, staged: int, dead: int, rejected: int) -> Progress:
    return Progress(
        enqueued=enqueued,
        committed=committed,
        staged=staged,
        dead_lettered=dead,
        rejected_rows=rejected,
        remaining=max(0, enqueued - committed - staged - dead),
        committed_fraction=committed / enqueued if enqueued else 0.0,
    )


# ---------------------------------------------------------------- reading Redis


def redis_now_s(client: redis.Redis) -> float:
    seconds, microseconds = client.time()
    return float(seconds) + float(microseconds) / MICROSECONDS_PER_S


def queue_depths(client: redis.Redis) -> list[QueueDepth]:
    in_flight = split_unacked(
        value for _tag, value in client.hscan_iter(KOMBU_UNACKED_KEY, count=UNACKED_SCAN_COUNT)
    )
    with client.pipeline(transaction=False) as pipe:
        for queue in QUEUES:
            pipe.llen(queue)
        waiting = pipe.execute()
    return [
        QueueDepth(queue=queue, waiting=int(depth), in_flight=in_flight.get(queue, 0))
        for queue, depth in zip(QUEUES, waiting, strict=True)
    ]


def load_settings(client: redis.Redis, run: str) -> RunSettings:
    raw = client.get(RunKeys(run).settings)
    if raw is None:
        raise RunNotFound(
            f"no run named {run!r} in Redis: start it with `python -m producer enqueue DATA --run {run}`"
        )
    return decode_run_settings(raw)


def gather_status(
    client: redis.Redis,
    run: str,
    *,
    price_per_gpu_hour: float | None = None,
    price_source: str = "given",
    now_s: float | None = None,
) -> RunStatus:
    """One consistent-enough snapshot of the run (each group of figures is read in one round trip)."""
    settings = load_settings(client, run)
    keys = RunKeys(run)
    now = redis_now_s(client) if now_s is None else now_s
    with client.pipeline(transaction=False) as pipe:
        pipe.scard(keys.enqueued)
        pipe.scard(keys.done)
        pipe.zcard(keys.staged_index)
        pipe.hlen(keys.dead)
        pipe.hlen(keys.rejected)
        pipe.hgetall(keys.stats)
        pipe.get(keys.staged_bytes)
        pipe.zrange(keys.staged_index, 0, 0, withscores=True)
        pipe.lrange(keys.manifest, 0, -1)
        pipe.xrange(keys.events, min=str(int((now - RATE_WINDOW_S) * MS_PER_S)), max="+")
        pipe.xrange(keys.events, min="-", max="+", count=1)
        pipe.xrevrange(keys.events, max="+", min="-", count=GPU_SAMPLE_EVENTS)
        replies = pipe.execute()
    enqueued, committed, staged, dead, rejected, stats_raw, staged_bytes, oldest = replies[:8]
    manifest, window_raw, oldest_raw, recent_raw = replies[8:]
    counters = parse_counters(stats_raw)
    progress = make_progress(
        enqueued=enqueued, committed=committed, staged=staged, dead=dead, rejected=rejected
    )
    recent_events = parse_events(recent_raw)
    oldest_events = parse_events(oldest_raw)
    started = run_started_s(
        counters.get(FIRST_COMPLETION_AT), oldest_events[0].at_s if oldest_events else None
    )
    last_completion = recent_events[0].at_s if recent_events else None
    paused = pause_state(client, run)
    state = run_state(progress, completions=counters.get(COMPLETIONS, 0), paused=paused is not None)
    ended = last_completion if state in (STATE_FINISHED, STATE_UPLOADING) and last_completion else now
    window = recent_window_s(now, started)
    window_events = events_in_window(parse_events(window_raw), now_s=now, window_s=window)
    last_minute = window_rates(window_events, now_s=now, window_s=window)
    completions = counters.get(COMPLETIONS, 0)
    output_tokens = counters.get(COMPLETION_TOKENS, 0)
    elapsed = max(0.0, ended - started) if started is not None else 0.0
    eta = estimate_eta(progress.remaining, last_minute, now_s=now, paused=paused is not None)
    heartbeats = read_heartbeats(client)
    gpus = gpu_rows(window_events, window, heartbeats, {event.gpu for event in recent_events}, now_s=now)
    entries = [decode_entry(raw) for raw in manifest]
    queues = queue_depths(client)
    stranded = stranded_warning(progress, queues, paused=paused is not None)
    return RunStatus(
        run=run,
        now=now,
        state=state,
        progress=progress,
        throughput=Throughput(
            last_minute=last_minute,
            whole_run=rates_over(completions, output_tokens, elapsed),
            mean_output_tokens=output_tokens / completions if completions else None,
            first_completion_at=started,
            last_completion_at=last_completion,
        ),
        eta=eta,
        cost=estimate_cost(
            gpus=len(gpus),
            elapsed_s=elapsed,
            eta_s=eta.seconds,
            price_per_gpu_hour=price_per_gpu_hour,
            price_source=price_source,
        ),
        gpus=gpus,
        queues=queues,
        queues_note=IN_FLIGHT_NOTE,
        upload=UploadBacklog(
            staged=staged,
            staged_bytes=int(staged_bytes or 0),
            oldest_staged_age_s=max(0.0, now - oldest[0][1]) if oldest else None,
            objects_committed=len(entries),
            committed_bytes=sum(entry.bytes for entry in entries),
        ),
        dead_letters=dead_letters_by_reason(counters),
        quality=quality_figures(counters),
        gate=gate_figures(read_gate(client, run, settings.gate), settings),
        paused=(
            PauseFigures(reason=paused.reason, by=paused.by, at=paused.at, for_s=max(0.0, now - paused.at))
            if paused is not None
            else None
        ),
        warnings=[warning for warning in (stranded, token_ids_warning(counters)) if warning],
    )
