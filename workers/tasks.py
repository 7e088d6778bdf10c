"""Thin Celery tasks: decode the message, call a plain function, map errors to retry or give up."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Task
from celery.signals import worker_shutdown

from workers.app import FLUSH_TASK, GENERATE_TASK, app
from workers.batches import dead_letter_batch, process_batch, record_batch_failure
from workers.context import WorkerContext
from workers.errors import RetryLater, RunBroken
from workers.uploader import FlushReport

log = logging.getLogger(__name__)

UNEXPECTED_ERROR_RETRY_S = 60.0
MAX_BATCH_FAILURES = 5  # unexpected errors on one batch before its prompts are dead-lettered

_context: WorkerContext | None = None
_context_lock = threading.Lock()


def context() -> WorkerContext:
    """The process's context, built on first use from the settings the app was configured with."""
    global _context
    with _context_lock:
        if _context is None:
            _context = WorkerContext(app.conf.draftgen_settings)
        return _context


def _flush_run(ctx: WorkerContext, run: str) -> FlushReport:
    return ctx.uploader.flush(run)


@worker_shutdown.connect
def _close_engine(**_: Any) -> None:
    if _context is not None and "engine" in _context.__dict__:
        _context.engine.close()


@app.task(name=GENERATE_TASK, bind=True, max_retries=None)  # None here: retry without limit
def generate(self: Task, run: str, batch_id: str) -> dict[str, Any]:
    try:
        report = process_batch(context(), run, batch_id)
    except RetryLater as error:
        log.warning("batch %s of run %s: %s; retrying in %.0f s", batch_id, run, error, error.delay_s)
        raise self.retry(countdown=error.delay_s) from error
    except RunBroken:
        log.exception("batch %s names a broken run; dropping the message", batch_id)
        raise
    except Exception as error:
        if record_batch_failure(context(), run, batch_id) >= MAX_BATCH_FAILURES:
            dead_letter_batch(context(), run, batch_id, f"{type(error).__name__}: {error}")
            raise
        log.exception("batch %s of run %s failed unexpectedly; retrying", batch_id, run)
        raise self.retry(countdown=UNEXPECTED_ERROR_RETRY_S) from error
    flush.apply_async(args=[run])  # the uploader decides whether a part is due
    return report.__dict__


@app.task(name=FLUSH_TASK, bind=True, max_retries=None)
def flush(self: Task, run: str) -> dict[str, Any]:
    try:
        report = _flush_run(context(), run)
    except RetryLater as error:
        raise self.retry(countdown=error.delay_s) from error
    except RunBroken:
        log.exception("flush names a broken run; dropping the message")
        raise
    except Exception as error:
        # Staged completions stay in Redis; a later flush commits them.
        log.exception("flush of run %s failed unexpectedly; retrying", run)
        raise self.retry(countdown=UNEXPECTED_ERROR_RETRY_S) from error
    return report.__dict__
