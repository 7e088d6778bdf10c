"""Every status figure as a pure function of values read from Redis and of `now` (Redis's clock), so each
is unit-tested with a fake clock."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from core.records import Quality
from core.run_settings.model import RunSettings
from producer.status.model import (
    Cost,
    Eta,
    GateFigures,
    GpuRow,
    HeldWork,
    Progress,
    QualityFigures,
    QueueDepth,
    Rates,
)
from workers.state.gate_reading import DROPPED_TRUNCATIONS, GateReading
from workers.state.heartbeats import WorkerHeartbeat
from workers.state.queues import GENERATE_QUEUE
from workers.state.stats_fields import (
    COMPLETIONS,
    DEAD_PREFIX,
    FINISH_PREFIX,
    RATE_WINDOW_S,
    TOKEN_IDS_MISSING,
    generated_turns,
    quality_field,
)

MIN_COMPLETIONS_FOR_ETA = 20  # fewer in the window and the rate is noise: the ETA says "unknown"
SECONDS_PER_HOUR = 3600.0
MS_PER_S = 1000.0
QUALITY_SHOWN = (
    Quality.EMPTY_ANSWER,
    Quality.TRUNCATED_IN_THINKING,
    Quality.TRUNCATED_IN_ANSWER,
    Quality.NO_REASONING,
)

STATE_WAITING = "waiting for the first completion"
STATE_RUNNING = "running"
STATE_PAUSED = "paused"
STATE_UPLOADING = "generated; uploading the rest"
STATE_DRAINING = "generated; closing its last batches"
STATE_FINISHED = "finished"
UNKNOWN_HOLDER = "(holder unreadable)"  # a lease whose holder record does not decode


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
    lives: Mapping[str, str] | None = None,
) -> list[GpuRow]:
    """A row per GPU that served the run recently, holds its batches, or has a live heartbeat, sorted by
    label; `lives` says whether each one's worker process lives."""
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
                life=(lives or {}).get(worker, ""),
            )
        )
    return rows


def held_work(
    leases: Sequence[tuple[str, float]],
    holders: Mapping[str, str],
    lives: Mapping[str, str],
    *,
    reconcile_interval_s: float,
) -> list[HeldWork]:
    """The run's leased batches by the GPU holding them: `leases` (batch id, expiry), `holders` (batch
    id -> GPU label), `lives` (GPU label -> its worker's life)."""
    by_worker: dict[str, list[float]] = {}
    for batch_id, expires_at in leases:
        by_worker.setdefault(holders.get(batch_id, UNKNOWN_HOLDER), []).append(expires_at)
    return [
        HeldWork(
            worker=worker,
            life=lives.get(worker, ""),
            batches=len(expiries),
            leases_end_at=max(expiries),
            back_by=max(expiries) + reconcile_interval_s,
        )
        for worker, expiries in sorted(by_worker.items())
    ]


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
    judged = generated_turns(counters) + dropped
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
    """`finished` only once every prompt is in the output: committed, or dead-lettered and committed."""
    if paused:
        return STATE_PAUSED
    if progress.enqueued > 0 and progress.remaining <= 0:
        if progress.staged or progress.dead_pending:
            return STATE_UPLOADING
        return STATE_DRAINING if progress.open_batches else STATE_FINISHED
    return STATE_RUNNING if completions > 0 or progress.committed or progress.dead_lettered else STATE_WAITING


def stranded_warning(
    progress: Progress, queues: Sequence[QueueDepth], *, paused: bool, held_batches: int = 0
) -> str | None:
    """Prompts left to generate while no generate message exists anywhere and no worker, live or dead,
    holds a batch of the run under a lease (a held batch comes back when its lease runs out): their
    messages are gone."""
    generate = [queue for queue in queues if queue.queue == GENERATE_QUEUE]
    if paused or progress.remaining <= 0 or held_batches or any(q.waiting or q.in_flight for q in generate):
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


def make_progress(
    *,
    enqueued: int,
    committed: int,
    staged: int,
    dead: int,
    rejected: int,
    dead_pending: int = 0,
    open_batches: int = 0,
) -> Progress:
    return Progress(
        enqueued=enqueued,
        committed=committed,
        staged=staged,
        dead_lettered=dead,
        dead_pending=dead_pending,
        open_batches=open_batches,
        rejected_rows=rejected,
        remaining=max(0, enqueued - committed - staged - dead),
        committed_fraction=committed / enqueued if enqueued else 0.0,
    )
