"""One generate message: the batch's prompts that still need a completion, generated and handed over."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from inference.records import DeadLetter, PromptBatch
from workers.codec import decode_blob
from workers.context import WorkerContext
from workers.control import pause_state
from workers.errors import RetryLater
from workers.generation import Truncation
from workers.ledger import RunLedger
from workers.quality_gate import check_quality_gate

log = logging.getLogger(__name__)

PAUSED_RETRY_S = 30.0
BACKLOG_RETRY_S = 30.0
REASON_BATCH_FAILED = "batch_failed"
MAX_STAGED_PER_RUN = 50_000  # upload backlog bound: past it, generation waits for the uploader


@dataclass(frozen=True)
class BatchReport:
    batch_id: str
    prompts: int
    generated: int
    dead_lettered: int
    skipped: int


def process_batch(ctx: WorkerContext, run: str, batch_id: str) -> BatchReport:
    """Generate what the batch still needs. Raises RetryLater to have the message delivered again later."""
    ledger = RunLedger(ctx.redis, run)
    paused = pause_state(ctx.redis, run)
    if paused is not None:
        raise RetryLater(f"run {run!r} is paused: {paused.reason}", delay_s=PAUSED_RETRY_S)
    if ctx.redis.zcard(ledger.keys.staged_index) >= MAX_STAGED_PER_RUN:
        raise RetryLater(
            f"run {run!r} has {MAX_STAGED_PER_RUN}+ completions awaiting upload", delay_s=BACKLOG_RETRY_S
        )
    blob = ctx.redis.get(ledger.keys.batch(batch_id))
    if blob is None:
        log.info("batch %s of run %s: already finished", batch_id, run)
        return BatchReport(batch_id, prompts=0, generated=0, dead_lettered=0, skipped=0)
    batch = decode_blob(blob, PromptBatch)
    pending = ledger.pending(batch.prompts)
    settings = ctx.run_settings(run)
    truncation = Truncation(settings.truncated_thinking, settings.retry_max_tokens_cap)
    outcome = ctx.engine.run_batch(run, pending, settings.sampling, ledger, truncation)
    tripped = check_quality_gate(ctx.redis, run, settings.gate)
    if tripped:
        log.error("run %s paused by the quality gate: %s", run, tripped)
    if outcome.unreachable:
        raise RetryLater(
            f"batch {batch_id}: {len(outcome.unreachable)} prompts got no answer from "
            f"{ctx.settings.server_url} ({outcome.last_error})",
            delay_s=ctx.settings.server_down_retry_s,
        )
    ctx.redis.delete(ledger.keys.batch(batch_id))
    report = BatchReport(
        batch_id,
        prompts=len(batch.prompts),
        generated=outcome.staged,
        dead_lettered=outcome.dead_lettered,
        skipped=len(batch.prompts) - len(pending) + outcome.already_handled,
    )
    log.info("run %s %s", run, report)
    return report


def dead_letter_batch(ctx: WorkerContext, run: str, batch_id: str, error: str) -> int:
    """Give up on a batch that keeps failing: its remaining prompts go to the dead-letter set."""
    ledger = RunLedger(ctx.redis, run)
    blob = ctx.redis.get(ledger.keys.batch(batch_id))
    if blob is None:
        return 0
    batch = decode_blob(blob, PromptBatch)
    letters = [
        DeadLetter(prompt_id=p.id, row=p.row, reason=REASON_BATCH_FAILED, error=error, attempts=0)
        for p in ledger.pending(batch.prompts)
    ]
    count = sum(ledger.dead_letter(letter) for letter in letters)
    ctx.redis.delete(ledger.keys.batch(batch_id))
    log.error(
        "batch %s of run %s: %d prompts dead-lettered after repeated failures: %s",
        batch_id,
        run,
        count,
        error,
    )
    return count


def record_batch_failure(ctx: WorkerContext, run: str, batch_id: str) -> int:
    """Count an unexpected failure of a batch; returns how many it has had."""
    return int(ctx.redis.hincrby(RunLedger(ctx.redis, run).keys.batch_failures, batch_id, 1))
