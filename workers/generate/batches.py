"""One generate message: lease the batch, generate what it still needs, hand it over, finish or hand back.

`handle_generate` is what the Celery task calls. It returns a report when the message may be
acknowledged, and raises RetryLater when the batch must come back later (its lease released, so
nothing else redelivers it meanwhile). Whatever else happens, the lease runs out and the reconciler
dispatches the batch again: no path leaves a batch without a message for good.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import redis

from core.records import DeadLetter, DeadLetterReason, PromptBatch
from workers.errors import RecordUnreadable, RetryLater, RunBroken
from workers.generate.generation import BatchOutcome, Truncation
from workers.generate.quality_gate import check_quality_gate
from workers.recovery.leases import Acquired, Lease, defer_batch, finish_batch
from workers.state.codec import decode_blob
from workers.state.control import PAUSED_RETRY_S, pause_state
from workers.state.ledger import RunLedger
from workers.state.quarantine import Quarantine, QuarantineKind, QuarantineReason, quarantined, unreadable
from workers.state.record_limits import batch_body_limit_bytes

if TYPE_CHECKING:
    import threading

    from core.run_settings.model import RunSettings
    from workers.generate.batch_life import BatchLife
    from workers.generate.generation import GenerationEngine
    from workers.generate.server_record import ServerRecord
    from workers.generate.tails import BatchTails
    from workers.recovery.leases import LeaseKeeper


class BatchWorkerSettings(Protocol):
    @property
    def server_url(self) -> str: ...
    @property
    def server_down_retry_s(self) -> float: ...


class BatchContext(Protocol):
    """What a batch needs of its worker process (`workers.context.WorkerContext` is the one there is)."""

    redis: redis.Redis
    stopping: threading.Event
    tails: BatchTails
    batch_life: BatchLife

    @property
    def settings(self) -> BatchWorkerSettings: ...
    @property
    def engine(self) -> GenerationEngine: ...
    @property
    def leases(self) -> LeaseKeeper: ...
    @property
    def server_record(self) -> ServerRecord: ...
    def run_settings(self, run: str) -> RunSettings: ...
    def dispatch_generate(
        self, run: str, batch_id: str, *, countdown_s: float, resumed: bool = False
    ) -> None: ...
    def dispatch_flush(self, run: str) -> None: ...


log = logging.getLogger(__name__)

BACKLOG_RETRY_S = 30.0
HAND_BACK_NOW_S = 0.0  # a stopping worker's batches go back for another worker at once
REDIS_UNREACHABLE_RETRY_S = 10.0
UNEXPECTED_ERROR_RETRY_S = 60.0
MAX_BATCH_FAILURES = 5  # unexpected errors on one batch before its prompts are dead-lettered
MAX_STAGED_PER_RUN = 50_000  # upload backlog bound: past it, generation waits for the uploader


@dataclass(frozen=True)
class BatchReport:
    batch_id: str
    prompts: int
    generated: int
    dead_lettered: int
    skipped: int
    note: str = ""
    turns: int = 0  # the requests the batch's prompts take at least: a conversation one per user turn
    output_tokens: int = 0  # of the completions generated
    detached: bool = False  # every prompt sent, the last requests still running: its tail settles it
    given_up: bool = False  # its prompts dead-lettered after repeated failures

    @property
    def handed_over(self) -> bool:
        return bool(self.generated or self.dead_lettered)

    def summary(self) -> str:
        """The batch's end in one line, as Flower shows a task's result."""
        counts = (
            f"{self.generated} generated ({self.output_tokens:,} output tokens), "
            f"{self.dead_lettered} dead-lettered, {self.skipped} already done, of {self.prompts} prompts"
        )
        return f"{counts}; {self.note}" if self.note else counts


def _nothing(batch_id: str, note: str) -> BatchReport:
    return BatchReport(batch_id, prompts=0, generated=0, dead_lettered=0, skipped=0, note=note)


def handle_generate(ctx: BatchContext, run: str, batch_id: str, *, task_id: str = "") -> BatchReport:
    """The whole of one generate message, errors mapped: RetryLater, RunBroken, or a report. A detached
    report's batch is settled later, its end told to `ctx.batch_life` under `task_id`."""
    try:
        return process_batch(ctx, run, batch_id, task_id=task_id)
    except (RetryLater, RunBroken):
        raise
    except redis.RedisError as error:  # the coordination point is away: not the batch's fault
        raise RetryLater(f"Redis unreachable: {error}", delay_s=REDIS_UNREACHABLE_RETRY_S) from error
    except Exception as error:
        return _count_failure(ctx, run, batch_id, error)


def _count_failure(ctx: BatchContext, run: str, batch_id: str, error: Exception) -> BatchReport:
    log.exception("batch %s of run %s failed unexpectedly", batch_id, run)
    try:
        failures = int(ctx.redis.hincrby(RunLedger(ctx.redis, run).keys.batch_failures, batch_id, 1))
        if failures >= MAX_BATCH_FAILURES:
            given_up = dead_letter_batch(ctx, run, batch_id, f"{type(error).__name__}: {error}")
            return BatchReport(
                batch_id,
                prompts=given_up,
                generated=0,
                dead_lettered=given_up,
                skipped=0,
                note=f"given up after {failures} failures: {type(error).__name__}: {error}",
                given_up=True,
            )
    except redis.RedisError as redis_error:  # counted or not, the batch comes back
        log.warning("could not count the failure of batch %s: %s", batch_id, redis_error)
    raise RetryLater(f"{type(error).__name__}: {error}", delay_s=UNEXPECTED_ERROR_RETRY_S) from error


def process_batch(ctx: BatchContext, run: str, batch_id: str, *, task_id: str = "") -> BatchReport:
    """Generate what the batch still needs under its lease."""
    if ctx.stopping.is_set():
        raise RetryLater("worker shutting down", delay_s=HAND_BACK_NOW_S)
    ledger = RunLedger(ctx.redis, run)
    paused = pause_state(ctx.redis, run)
    if paused is not None:
        defer_batch(ctx.redis, run, batch_id, PAUSED_RETRY_S)
        raise RetryLater(f"run {run!r} is paused: {paused.reason}", delay_s=PAUSED_RETRY_S)
    if ctx.redis.zcard(ledger.keys.staged_index) >= MAX_STAGED_PER_RUN:
        defer_batch(ctx.redis, run, batch_id, BACKLOG_RETRY_S)
        raise RetryLater(
            f"run {run!r} has {MAX_STAGED_PER_RUN}+ completions awaiting upload", delay_s=BACKLOG_RETRY_S
        )
    ctx.run_settings(run)  # an unknown run is refused before anything is leased
    acquired, lease = ctx.leases.acquire(run, batch_id)
    if acquired is Acquired.FINISHED:
        log.info("batch %s of run %s: already finished", batch_id, run)
        return _nothing(batch_id, "already finished")
    if acquired is Acquired.HELD:
        log.info("batch %s of run %s: another worker is generating it", batch_id, run)
        return _nothing(batch_id, "held by another worker")
    try:
        return _generate_leased(ctx, ledger, lease, task_id)
    except RetryLater as error:  # a hand-back gave the lease up; anything else asking to retry did not
        ctx.leases.release_if_held(lease, delay_s=error.delay_s)
        raise
    except redis.RedisError:
        ctx.leases.release_soon(lease, delay_s=REDIS_UNREACHABLE_RETRY_S)
        raise
    except Exception:
        ctx.leases.release_soon(lease, delay_s=UNEXPECTED_ERROR_RETRY_S)
        raise
    except BaseException:
        ctx.leases.abandon(lease)  # runs out; the reconciler dispatches the batch again
        raise


def _generate_leased(ctx: BatchContext, ledger: RunLedger, lease: Lease, task_id: str) -> BatchReport:
    run, batch_id = lease.run, lease.batch_id
    blob = ctx.redis.get(ledger.keys.batch(batch_id))
    if blob is None:  # finished between the lease and now
        ctx.leases.abandon(lease)
        return _nothing(batch_id, "already finished")
    settings = ctx.run_settings(run)
    batch = read_batch(ctx.redis, run, batch_id, blob, batch_size=settings.batch_size)
    if batch is None:  # quarantined, its lease with it
        ctx.leases.abandon(lease)
        return _nothing(batch_id, "quarantined: its body cannot be trusted")
    pending = ledger.pending(batch.prompts)
    truncation = Truncation(settings.truncated_thinking, settings.retry_max_tokens_cap)
    if pending:
        ctx.engine.origin = ctx.server_record.refresh()
    job = ctx.engine.submit_batch(
        run, pending, settings.sampling, ledger, truncation, still_held=lambda: ctx.leases.held(lease)
    )
    job.wait_sent()
    if job.done.done() or ctx.stopping.is_set():  # a stopping worker hands back through Celery's retry
        return _settle(ctx, lease, batch, len(pending), job.outcome())
    ctx.tails.detach(job.done, lambda done: _settle_tail(ctx, lease, batch, len(pending), done, task_id))
    skipped = len(batch.prompts) - len(pending)
    note = "every prompt sent; the last requests finish after this message"
    return BatchReport(
        batch_id,
        prompts=len(batch.prompts),
        generated=0,
        dead_lettered=0,
        skipped=skipped,
        note=note,
        turns=sum(p.turn_count for p in batch.prompts),
        detached=True,
    )


def _settle(
    ctx: BatchContext, lease: Lease, batch: PromptBatch, pending: int, outcome: BatchOutcome
) -> BatchReport:
    """Every prompt of the batch is settled: finish it, or hand it back (RetryLater) if some got no answer."""
    run = lease.run
    tripped = check_quality_gate(ctx.redis, run, ctx.run_settings(run).gate)
    if tripped:
        log.error("run %s paused by the quality gate: %s", run, tripped)
    if outcome.unreachable:
        delay_s = HAND_BACK_NOW_S if ctx.stopping.is_set() else ctx.settings.server_down_retry_s
        why = (
            f"{len(outcome.unreachable)} prompts got no answer from {ctx.settings.server_url} "
            f"({outcome.last_error})"
        )
        return _hand_back(ctx, lease, why, delay_s=delay_s)
    unsettled = ctx.leases.finish(lease, [p.id for p in batch.prompts])
    if unsettled:
        why = f"Redis holds no hand-over of {len(unsettled)} prompts (it lost its last writes)"
        return _hand_back(ctx, lease, why, delay_s=HAND_BACK_NOW_S)
    report = BatchReport(
        lease.batch_id,
        prompts=len(batch.prompts),
        generated=outcome.staged,
        dead_lettered=outcome.dead_lettered,
        skipped=len(batch.prompts) - pending + outcome.already_handled,
        turns=sum(p.turn_count for p in batch.prompts),
        output_tokens=outcome.output_tokens,
    )
    log.info("run %s %s", run, report)
    return report


def _settle_tail(
    ctx: BatchContext,
    lease: Lease,
    batch: PromptBatch,
    pending: int,
    done: Future[BatchOutcome],
    task_id: str = "",
) -> None:
    """A detached batch's last prompt settled. Its message is gone: a hand-back sends a new one."""
    run, batch_id = lease.run, lease.batch_id
    life = ctx.batch_life
    try:
        report = _settle(ctx, lease, batch, pending, done.result())
    except RetryLater as error:
        log.warning("batch %s of run %s: %s; dispatched again in %.0f s", batch_id, run, error, error.delay_s)
        ctx.leases.release_if_held(lease, delay_s=error.delay_s)
        ctx.dispatch_generate(run, batch_id, countdown_s=error.delay_s, resumed=error.resumed)
        life.retried(task_id, f"{error}; dispatched again in {error.delay_s:.0f} s")
        return
    except redis.RedisError as error:
        ctx.leases.release_soon(lease, delay_s=REDIS_UNREACHABLE_RETRY_S)  # the reconciler sends it again
        life.retried(task_id, f"Redis unreachable ({error}); dispatched again once its lease runs out")
        raise
    except Exception as error:
        ctx.leases.release_soon(lease, delay_s=UNEXPECTED_ERROR_RETRY_S)
        try:
            report = _count_failure(ctx, run, batch_id, error)
        except RetryLater as retry:
            ctx.dispatch_generate(run, batch_id, countdown_s=retry.delay_s)
            life.retried(task_id, f"{retry}; dispatched again in {retry.delay_s:.0f} s")
            return
    if report.handed_over:
        ctx.dispatch_flush(run)
    if report.given_up:
        life.failed(task_id, report.note)
    else:
        life.succeeded(task_id, report.summary())


def _hand_back(ctx: BatchContext, lease: Lease, why: str, *, delay_s: float) -> BatchReport:
    """Some prompts are still to generate: the batch comes back in `delay_s`, before every batch not begun,
    unless another execution has it now."""
    if not ctx.leases.release(lease, delay_s=delay_s):
        return _nothing(lease.batch_id, "taken over by another worker")
    raise RetryLater(f"batch {lease.batch_id}: {why}", delay_s=delay_s, resumed=True)


def read_batch(
    client: redis.Redis, run: str, batch_id: str, blob: bytes, *, batch_size: int
) -> PromptBatch | None:
    """The batch a body holds, or None once the body is quarantined: it cannot be read, or it holds
    another batch (its prompts are then held by no batch, and an `enqueue` re-run batches them again)."""
    limit = batch_body_limit_bytes(batch_size)
    try:
        batch = decode_blob(blob, PromptBatch, limit_bytes=limit)
    except RecordUnreadable as error:
        entry = unreadable(QuarantineKind.BATCH, batch_id, blob, error, inflated_limit_bytes=limit)
    else:
        if batch.batch_id == batch_id and batch.run == run:
            return batch
        entry = quarantined(
            QuarantineKind.BATCH,
            batch_id,
            blob,
            QuarantineReason.BATCH_ID_MISMATCH,
            f"under {batch_id!r} of run {run!r}, it holds batch {batch.batch_id!r} of run {batch.run!r}",
            inflated_limit_bytes=limit,
        )
    Quarantine(client, run).batch(entry)
    log.error("batch %s of run %s quarantined (%s: %s)", batch_id, run, entry.reason, entry.detail)
    return None


def dead_letter_batch(ctx: BatchContext, run: str, batch_id: str, error: str) -> int:
    """Give up on a batch that keeps failing: its remaining prompts go to the dead-letter set."""
    ledger = RunLedger(ctx.redis, run)
    blob = ctx.redis.get(ledger.keys.batch(batch_id))
    if blob is None:
        return 0
    batch = read_batch(ctx.redis, run, batch_id, blob, batch_size=ctx.run_settings(run).batch_size)
    if batch is None:
        return 0
    letters = [
        DeadLetter(
            prompt_id=p.id,
            row=p.row,
            file=p.file,
            reason=DeadLetterReason.BATCH_FAILED,
            error=error,
            attempts=0,
        )
        for p in ledger.pending(batch.prompts)
    ]
    count = sum(ledger.dead_letter(letter) for letter in letters)
    unsettled = finish_batch(ctx.redis, run, batch_id, [p.id for p in batch.prompts])
    if unsettled:  # Redis lost the letters just written: the reconciler dispatches the batch again
        log.warning("batch %s of run %s: %d dead letters lost by Redis", batch_id, run, len(unsettled))
    log.error(
        "batch %s of run %s: %d prompts dead-lettered after repeated failures: %s",
        batch_id,
        run,
        count,
        error,
    )
    return count
