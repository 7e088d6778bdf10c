"""Thin Celery tasks: decode the message, call a plain function, map errors to retry or give up.

The tasks are registered on an app by `register_tasks`, with the holder of the process's context:
nothing here reads a global, so a test builds an app around a context of its own.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from celery import Celery, Task

from workers.context import ContextHolder
from workers.errors import RetryLater, RunBroken
from workers.generate.batches import UNEXPECTED_ERROR_RETRY_S, handle_generate
from workers.state.queues import FLUSH_TASK, GENERATE_TASK, RESUMED_BATCH_PRIORITY

log = logging.getLogger(__name__)


def register_tasks(app: Celery, contexts: ContextHolder) -> None:
    @app.task(name=FLUSH_TASK, bind=True, max_retries=None, shared=False)  # None: retry forever
    def flush(self: Task, run: str) -> dict[str, Any]:
        context = contexts.get()
        try:
            report = context.uploader.flush(run)
        except RetryLater as error:
            raise self.retry(countdown=error.delay_s) from error
        except RunBroken:
            log.exception("flush names a broken run; dropping the message")
            raise
        except Exception as error:
            # Staged completions stay in Redis; a later flush commits them.
            log.exception("flush of run %s failed unexpectedly; retrying", run)
            raise self.retry(countdown=UNEXPECTED_ERROR_RETRY_S) from error
        for batch_id in report.reopened_batches:  # a quarantined prompt is generated again
            context.dispatch_generate(run, batch_id, countdown_s=0.0)
        return asdict(report)

    # Celery's own events would show the message's few milliseconds; the batch's life is told instead
    # (workers/generate/batch_life.py), under the same task id.
    @app.task(name=GENERATE_TASK, bind=True, max_retries=None, shared=False, send_events=False)
    def generate(self: Task, run: str, batch_id: str) -> dict[str, Any]:
        context = contexts.get()
        task_id = self.request.id
        context.batch_life.began(task_id, run, batch_id, retries=self.request.retries)
        try:
            report = handle_generate(context, run, batch_id, task_id=task_id)
        except RetryLater as error:
            log.warning("batch %s of run %s: %s; retrying in %.0f s", batch_id, run, error, error.delay_s)
            context.batch_life.retried(task_id, f"{error}; again in {error.delay_s:.0f} s")
            resumed = {"priority": RESUMED_BATCH_PRIORITY} if error.resumed else {}  # else its own
            raise self.retry(countdown=error.delay_s, **resumed) from error
        except RunBroken as error:
            log.exception("batch %s names a broken run; dropping the message", batch_id)
            context.batch_life.failed(task_id, f"{type(error).__name__}: {error}")
            raise
        if report.given_up:
            context.batch_life.failed(task_id, report.note)
        elif not report.detached:  # else its tail tells the end (workers/generate/batches.py)
            context.batch_life.succeeded(task_id, report.summary())
        if report.handed_over:
            flush.apply_async(args=[run])  # the uploader decides whether a part is due
        return asdict(report)
