"""The thin tasks never give up on a message that only needs to wait: Celery's default is 3 retries."""

from __future__ import annotations

import pytest
from celery.exceptions import Retry

from workers import tasks
from workers.errors import RetryLater

MANY_RETRIES = 50


def wait(*_: object) -> None:
    raise RetryLater("server down", delay_s=1.0)


@pytest.mark.parametrize("task", [tasks.generate, tasks.flush])
def test_a_task_that_must_wait_is_retried_however_often_it_waited_before(
    task: tasks.Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch (or flush) that has already been put back many times
    monkeypatch.setattr(tasks, "context", lambda: None)
    monkeypatch.setattr(tasks, "process_batch", wait)
    monkeypatch.setattr(tasks, "_flush_run", wait)
    args = ["run", "batch"] if task is tasks.generate else ["run"]
    # When it has to wait once more, then it is retried again rather than dropped
    with pytest.raises(Retry):
        task.apply(args=args, retries=MANY_RETRIES, throw=True)
