"""Errors of the worker side. The branch says whether a retry helps.

WorkerError
├── RetryLater            transient: the same work will succeed later (server down, lock held)
│   └── UploadLockLost    another uploader took over this run's flush; its work covers ours
├── RunBroken             permanent for this message: unknown run, unreadable settings
└── ShuttingDown          the worker is stopping: a wait for the server ends early
"""

from __future__ import annotations


class WorkerError(Exception):
    """Root of the worker-side errors."""


class RetryLater(WorkerError):
    """The work cannot be done now; redeliver it after `delay_s`."""

    def __init__(self, message: str, *, delay_s: float) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class UploadLockLost(RetryLater):
    """The upload lock expired or changed hands while this flush was writing."""


class RunBroken(WorkerError):
    """The message names a run that cannot be processed; retrying will not help."""


class ShuttingDown(WorkerError):
    """The worker process is stopping; whatever waited for the server gives up without a verdict."""
