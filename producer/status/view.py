"""Rendering a `RunStatus` for the terminal with rich: one renderable, used once or under `rich.live.Live`."""

from __future__ import annotations

import time

from rich import box
from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from producer.status.model import GpuRow, HeldWork, Rates, RedisPlace, RunStatus
from producer.status.suspects import SUSPECT_RECORDS_READ, Suspect, SuspectFigures
from workers.recovery.seat import HOLDER_GONE_AFTER_S
from workers.recovery.seat_view import WorkerLife

PROGRESS_BAR_WIDTH = 40
SECONDS_PER_MINUTE = 60
SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86400
BYTES_PER_KIB = 1024.0
HEALTHY_STATUS = 200
UNKNOWN = "unknown"
ABSENT = "–"
TOO_EARLY = "too early"
GPU_TABLE_PADDING = (0, 0, 0, 1)  # top, right, bottom, left: two spaces between columns, so 80 fit them all
MIN_RATED_WINDOW_S = 10.0  # completions land together; over a shorter span their rate means nothing
STATE_STYLES = {"paused": "bold red", "finished": "bold green", "running": "bold cyan"}


def duration(seconds: float | None) -> str:
    """`45 s`, `12 min 5 s`, `3 h 20 min`, `2 d 4 h`."""
    if seconds is None:
        return UNKNOWN
    whole = round(seconds)
    if whole < SECONDS_PER_MINUTE:
        return f"{whole} s"
    if whole < SECONDS_PER_HOUR:
        return f"{whole // SECONDS_PER_MINUTE} min {whole % SECONDS_PER_MINUTE} s"
    if whole < SECONDS_PER_DAY:
        return f"{whole // SECONDS_PER_HOUR} h {whole % SECONDS_PER_HOUR // SECONDS_PER_MINUTE} min"
    return f"{whole // SECONDS_PER_DAY} d {whole % SECONDS_PER_DAY // SECONDS_PER_HOUR} h"


def size(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < BYTES_PER_KIB:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= BYTES_PER_KIB
    return f"{value:.1f} TiB"


def percent(rate: float) -> str:
    return f"{rate:.1%}"


def money(usd: float | None) -> str:
    return f"${usd:,.2f}" if usd is not None else ABSENT


def clock(unix_s: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s)) if unix_s is not None else ABSENT


def _section(title: str) -> Text:
    return Text(f"\n{title}", style="bold")


def _progress(status: RunStatus) -> RenderableType:
    progress = status.progress
    line = Table.grid(padding=(0, 1))
    line.add_row(
        ProgressBar(total=max(progress.enqueued, 1), completed=progress.committed, width=PROGRESS_BAR_WIDTH),
        Text(f"{progress.committed:,} / {progress.enqueued:,} committed"),
        Text(percent(progress.committed_fraction), style="bold"),
    )
    dead = f"dead-lettered {progress.dead_lettered:,}"
    if progress.dead_pending:
        dead += f" ({progress.dead_pending:,} awaiting upload)"
    open_batches = f" · open batches {progress.open_batches:,}" if progress.remaining <= 0 else ""
    details = Text(
        f"staged, awaiting upload {progress.staged:,} · {dead} · "
        f"rejected rows {progress.rejected_rows:,} · still to generate {progress.remaining:,}{open_batches}"
    )
    return Group(line, details)


def _rate(rates: Rates, per_s: float, decimals: int) -> str:
    """A rate over a few seconds is noise (5 completions landing together read as 70,000 tokens/s)."""
    return f"{per_s:,.{decimals}f}" if rates.window_s >= MIN_RATED_WINDOW_S else TOO_EARLY


def _throughput(status: RunStatus) -> RenderableType:
    throughput = status.throughput
    recent, whole = throughput.last_minute, throughput.whole_run
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    table.add_column("")
    table.add_column(f"last {recent.window_s:.0f} s", justify="right")
    table.add_column(f"whole run ({duration(whole.window_s)})", justify="right")
    table.add_row(
        "completions/s", _rate(recent, recent.completions_per_s, 2), _rate(whole, whole.completions_per_s, 2)
    )
    table.add_row(
        "output tokens/s",
        _rate(recent, recent.output_tokens_per_s, 0),
        _rate(whole, whole.output_tokens_per_s, 0),
    )
    table.add_row("completions", f"{recent.completions:,}", f"{whole.completions:,}")
    if throughput.turns > whole.completions:  # conversations regenerated turn by turn
        table.add_row("assistant turns", "", f"{throughput.turns:,}")
    mean = throughput.mean_output_tokens
    table.add_row("mean output tokens a turn", "", f"{mean:,.0f}" if mean is not None else ABSENT)
    return table


def _eta_and_cost(status: RunStatus) -> RenderableType:
    eta, cost = status.eta, status.cost
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    finishes = f" (at {clock(eta.finishes_at)})" if eta.seconds else ""
    grid.add_row("ETA", f"{duration(eta.seconds)}{finishes}: {eta.basis}")
    projected = (
        f"; projected total {cost.projected_gpu_hours:,.2f} GPU-hours, {money(cost.projected_total_usd)}"
        if cost.projected_gpu_hours is not None
        else "; projected total unknown"
    )
    grid.add_row(
        "Cost",
        f"{cost.gpu_hours:,.2f} GPU-hours so far ({cost.gpus} GPUs × {duration(cost.elapsed_s)}), "
        f"{money(cost.so_far_usd)}{projected}",
    )
    grid.add_row("", Text(f"assumes {cost.assumption}", style="dim"))
    return grid


def _health(row: GpuRow) -> Text:
    if row.server_health is None:
        return Text("no answer" if row.heartbeat_age_s is not None else ABSENT, style="red")
    return Text(str(row.server_health), style="green" if row.server_health == HEALTHY_STATUS else "red")


def _gpus(status: RunStatus) -> RenderableType:
    if not status.gpus:
        return Text("no GPU has reported yet (no completion and no live worker heartbeat)")
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False, padding=GPU_TABLE_PADDING)
    table.add_column("GPU", overflow="fold")  # the figures keep their width; a long worker name folds
    for title in ("tokens/s", "done/min", "in flight", "accept", "/health", "suspended", "heartbeat"):
        table.add_column(title, justify="right", no_wrap=True)
    for row in status.gpus:
        in_flight = f"{row.in_flight}/{row.max_in_flight}" if row.in_flight is not None else ABSENT
        table.add_row(
            row.worker,
            f"{row.output_tokens_per_s:,.0f}",
            f"{row.completions_last_minute:,}",
            in_flight,
            f"{row.spec_accept_length:.2f}" if row.spec_accept_length is not None else ABSENT,
            _health(row),
            Text("yes", style="bold red")
            if row.suspended
            else ("no" if row.suspended is not None else ABSENT),
            _heartbeat(row),
        )
    return table


def _heartbeat(row: GpuRow) -> RenderableType:
    """The heartbeat's age, or what its worker's seat says when the worker is not alive."""
    if row.life == WorkerLife.DEAD:
        return Text("DEAD", style="bold red")
    if row.life == WorkerLife.SILENT:
        return Text("silent", style="yellow")
    return f"{duration(row.heartbeat_age_s)} ago" if row.heartbeat_age_s is not None else "none"


def held_line(work: HeldWork, now_s: float) -> str:
    """Where one GPU's held batches stand, and for a worker that is gone, how and when they come back."""
    batches = f"{work.batches:,} {'batch' if work.batches == 1 else 'batches'}"
    back = f"by {clock(work.back_by)} (in {duration(max(0.0, work.back_by - now_s))})"
    if work.life == WorkerLife.DEAD:
        return (
            f"{work.worker}: {batches} held by a dead worker, not lost: taken back at once by a worker that "
            f"starts on {work.worker}, else {back}, when their leases run out and the reconciler sends them "
            "to the other GPUs"
        )
    if work.life == WorkerLife.SILENT:
        return (
            f"{work.worker}: {batches}, its worker silent (a Redis restart, or its death: told within "
            f"{HOLDER_GONE_AFTER_S:.0f} s); back {back} if it stays so, or at once by a worker started there"
        )
    return f"{work.worker}: {batches} being generated"


def _held(status: RunStatus) -> RenderableType:
    if not status.held:
        return Text("no batch of this run is being generated")
    return Group(
        *(
            Text(held_line(work, status.now), style="bold yellow" if work.life == WorkerLife.DEAD else "")
            for work in status.held
        )
    )


def suspect_line(suspect: Suspect, now_s: float, convictions_to_dead: int) -> str:
    """Where one suspect of poison stands: on trial, waiting for its trial, or suspected."""
    convicted = f"{suspect.convictions} of {convictions_to_dead} convictions"
    if suspect.on_trial and suspect.since is not None:
        return (
            f"{suspect.prompt_id}: on trial alone on {suspect.worker} for "
            f"{duration(max(0.0, now_s - suspect.since))}; {convicted}"
        )
    if suspect.next_at is not None:
        return (
            f"{suspect.prompt_id}: waits for its trial alone on {suspect.worker}, by "
            f"{clock(suspect.next_at)} (in {duration(max(0.0, suspect.next_at - now_s))}), once its server "
            f"has worked {duration(suspect.control_s)} without failing; {convicted}"
        )
    if suspect.convictions or suspect.suspicions >= 2:
        return f"{suspect.prompt_id}: a suspect, tried alone at its batch's next delivery; {convicted}"
    return f"{suspect.prompt_id}: suspected once; a second suspicion makes it a suspect, tried alone"


def suspects_summary(figures: SuspectFigures) -> str:
    by = (
        f"every verdict by {clock(figures.verdicts_by)}"
        if figures.verdicts_by is not None
        else "no live worker"
    )
    return f"{figures.total} suspected of poison, {by}"


def _suspects(status: RunStatus) -> RenderableType:
    figures = status.suspects
    assert figures is not None
    lines = [Text(suspect_line(s, status.now, figures.convictions_to_dead)) for s in figures.suspects]
    shown = len(figures.suspects)
    counted = f"{figures.total:,}" + (
        "" if figures.read_all else f"+ (the first {SUSPECT_RECORDS_READ:,} read)"
    )
    more = f"; {figures.total - shown:,} more not shown" if figures.total > shown else ""
    verdicts = (
        f"every verdict by {clock(figures.verdicts_by)} at the latest (restarts of servers a trial takes "
        "down aside)"
        if figures.verdicts_by is not None
        else "no live worker to try them: their verdicts wait for one"
    )
    lines.append(
        Text(f"{counted} suspected{more}: the run ends once each is committed or dead-lettered, {verdicts}")
    )
    return Group(*lines)


def _queues_and_upload(status: RunStatus) -> RenderableType:
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    table.add_column("queue")
    table.add_column("waiting", justify="right")
    table.add_column("in flight", justify="right")
    for queue in status.queues:
        table.add_row(queue.queue, f"{queue.waiting:,}", f"{queue.in_flight:,}")
    upload = status.upload
    oldest = (
        f", oldest {duration(upload.oldest_staged_age_s)}" if upload.oldest_staged_age_s is not None else ""
    )
    return Group(
        table,
        Text(status.queues_note, style="dim"),
        Text(
            f"upload backlog {upload.staged:,} completions ({size(upload.staged_bytes)}){oldest}; "
            f"committed {upload.objects_committed:,} objects ({size(upload.committed_bytes)})"
        ),
    )


def _dead_letters(status: RunStatus) -> RenderableType:
    if not status.dead_letters:
        return Text("none")
    return Text(" · ".join(f"{reason} {count:,}" for reason, count in status.dead_letters.items()))


def _quality(status: RunStatus) -> RenderableType:
    quality, gate = status.quality, status.gate
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    table.add_column("label")
    table.add_column("count", justify="right")
    table.add_column(f"of {quality.judged:,}", justify="right")
    for label, count in quality.counts.items():
        table.add_row(label.replace("_", " "), f"{count:,}", percent(quality.rates[label]))
    finishes = " · ".join(f"{reason} {count:,}" for reason, count in quality.finish_reasons.items())
    verdict = (
        Text(f"would pause: {gate.failing}", style="bold red")
        if gate.failing
        else Text("passing" if gate.judged_since_resume >= gate.min_completions else "not judging yet")
    )
    gate_line = Text.assemble(
        f"gate: {gate.judged_since_resume:,} judged since the start or last resume "
        f"(judges from {gate.min_completions:,}); empty answers {percent(gate.empty_answer_rate)} "
        f"(limit {percent(gate.max_empty_answer_rate)}), truncated {percent(gate.truncated_rate)} "
        f"(limit {percent(gate.max_truncated_rate)}); truncated thinking: {gate.truncated_thinking_policy}; ",
        verdict,
    )
    return Group(table, Text(f"finish reasons: {finishes or ABSENT}"), gate_line)


def redis_place_line(place: RedisPlace) -> str:
    return (
        f"Redis: primary {place.master_name} at {place.primary}, as {place.answering} of {place.sentinels} "
        f"Sentinels say; {_count(place.failovers, 'failover')} since they began watching; "
        f"{_count(place.replicas, 'replica')}"
    )


def _count(number: int, thing: str) -> str:
    return f"no {thing}" if number == 0 else f"{number} {thing}" + ("" if number == 1 else "s")


def _header(status: RunStatus) -> RenderableType:
    header = Text.assemble(
        (f"run {status.run}", "bold"),
        "  ",
        (status.state, STATE_STYLES.get(status.state, "bold")),
        f"  at {clock(status.now)}",
    )
    lines: list[RenderableType] = [header]
    if status.redis is not None:
        lines.append(Text(redis_place_line(status.redis)))
    lines.extend(Text(f"WARNING: {warning}", style="bold yellow") for warning in status.warnings)
    if status.paused is not None:
        paused = status.paused
        lines.append(
            Text(
                f"PAUSED by {paused.by} {duration(paused.for_s)} ago: {paused.reason}\n"
                f"resume with `python -m producer resume --run {status.run}`",
                style="bold red",
            )
        )
    return Group(*lines)


def render_status(status: RunStatus) -> RenderableType:
    return Group(
        _header(status),
        _section("Progress"),
        _progress(status),
        _section("Throughput"),
        _throughput(status),
        _eta_and_cost(status),
        _section("GPUs (this run's tokens/s over the last minute; the rest from worker heartbeats)"),
        _gpus(status),
        _section("Batches held (under a lease, by the GPU generating them)"),
        _held(status),
        *(
            (
                _section("Suspected poison (tried alone before any verdict: docs/exactly-once.md)"),
                _suspects(status),
            )
            if status.suspects is not None
            else ()
        ),
        _section("Queues"),
        _queues_and_upload(status),
        _section("Dead letters"),
        _dead_letters(status),
        _section("Quality"),
        _quality(status),
    )


def status_line(status: RunStatus) -> str:
    """The run in one line, for a log: `status --watch` piped writes one per refresh."""
    progress, last_minute = status.progress, status.throughput.last_minute
    eta = duration(status.eta.seconds) if status.eta.seconds is not None else "unknown"
    return (
        f"{clock(status.now)} run {status.run} {status.state}: "
        f"{progress.committed:,}/{progress.enqueued:,} committed ({percent(progress.committed_fraction)}), "
        f"staged {progress.staged:,}, dead {progress.dead_lettered:,}, "
        f"{_rate(last_minute, last_minute.completions_per_s * SECONDS_PER_MINUTE, 0)} completions/min, "
        f"{_rate(last_minute, last_minute.output_tokens_per_s, 0)} tokens/s, ETA {eta}"
        + "".join(
            f"; {work.batches} batches held by dead {work.worker}, back by {clock(work.back_by)}"
            for work in status.held
            if work.life == WorkerLife.DEAD
        )
        + (f"; {suspects_summary(status.suspects)}" if status.suspects is not None else "")
    )
