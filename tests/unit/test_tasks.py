"""The thin tasks never give up on a message that only needs to wait: Celery's default is 3 retries."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery.exceptions import Retry

from workers.app import make_app
from workers.errors import RetryLater
from workers.generate.batch_life import BatchLife
from workers.settings import WorkerSettings
from workers.state.queues import FLUSH_TASK, GENERATE_TASK

MANY_RETRIES = 50


class WaitingUploader:
    def flush(self, run: str) -> Any:
        raise RetryLater("store unreachable", delay_s=1.0)


class StoppingContext:
    """A worker context whose generate worker is shutting down and whose store is unreachable."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.stopping = threading.Event()
        self.stopping.set()
        self.uploader = WaitingUploader()
        self.batch_life = BatchLife(GENERATE_TASK)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("task_name", "args"), [(GENERATE_TASK, ["run", "batch"]), (FLUSH_TASK, ["run"])])
def test_a_task_that_must_wait_is_retried_however_often_it_waited_before(
    task_name: str, args: list[str]
) -> None:
    # Given a batch (or flush) that has already been put back many times
    app = make_app(WorkerSettings(), context_factory=StoppingContext)  # type: ignore[arg-type]
    # When it has to wait once more, then it is retried again rather than dropped
    with pytest.raises(Retry):
        app.tasks[task_name].apply(args=args, retries=MANY_RETRIES, throw=True)
