"""Errors of the worker side. The branch says whether a retry helps.

WorkerError
├── RetryLater              transient: the same work will succeed later (server down, lock held)
│   ├── UploadLockLost      another uploader took over this run's flush; its work covers ours
│   ├── StoreUnavailable    the object store could not be reached or refused a write
│   └── FunctionsMissing    Redis lacks this version's protocol functions, and this user may not load them
├── RunBroken               permanent for this message: unknown run, unreadable settings
├── ShuttingDown            the worker is stopping: a wait for the server ends early
├── SeatHeld                another live process holds this GPU's seat: this one may not start
├── SeatRefused             this process's Redis user may not hold this GPU's seat (another node's user)
├── ObjectMissing           no object under that key (also a KeyError)
└── Refused                 what was given cannot work, whoever retries (also a ValueError)
    ├── InvalidRunName      a run name that is not a safe key and path segment
    ├── InvalidSetting      an unknown `DRAFTGEN_*` variable, or a value its setting cannot take
    ├── UnsafeKey           an object key that would name a file outside its folder
    ├── UnsupportedStoreUrl an output URL that is neither a folder, file:// nor s3://
    ├── OutputTaken         an output whose run.json names another run: an output belongs to one run
    ├── RecordUnreadable    a record read back from Redis that cannot be trusted (kept apart, never fatal)
    ├── RecordTooLarge      a completion past the record limit: dead-lettered, never handed over
    └── MalformedMessage    a queue item that is not one of draftgen's messages: parked, never delivered

Only this module is imported by those who catch them, so catching needs neither boto3 nor Celery.
"""

from __future__ import annotations

FUNCTIONS_MISSING_RETRY_S = 30.0  # work that met missing functions comes back this late


class WorkerError(Exception):
    """Root of the worker-side errors."""


class RetryLater(WorkerError):
    """The work cannot be done now; redeliver it after `delay_s`, before work not begun when `resumed`
    (a batch handed back once its work began)."""

    def __init__(self, message: str, *, delay_s: float, resumed: bool = False) -> None:
        super().__init__(message)
        self.delay_s = delay_s
        self.resumed = resumed


class UploadLockLost(RetryLater):
    """The upload lock expired or changed hands while this flush was writing."""


class FunctionsMissing(RetryLater):
    """Redis holds no functions of this version of the protocol, and this process's Redis user may not
    load them: the message names the command that does."""

    def __init__(self, message: str, *, delay_s: float = FUNCTIONS_MISSING_RETRY_S) -> None:
        super().__init__(message, delay_s=delay_s)


class RunBroken(WorkerError):
    """The message names a run that cannot be processed; retrying will not help."""


class ShuttingDown(WorkerError):
    """The worker process is stopping; whatever waited for the server gives up without a verdict."""


class StoreUnavailable(RetryLater):
    """The object store could not be reached or refused a write; the work waits in Redis."""


class SeatHeld(WorkerError):
    """A live worker process holds the seat of this GPU label: a second one would steal its batches."""


class SeatRefused(WorkerError):
    """Redis refused this process's user the seat of its GPU label (NOPERM): each GPU node's user may
    hold only the seats of its own host's labels."""


class ObjectMissing(WorkerError, KeyError):
    """No object under that key."""


class Refused(WorkerError, ValueError):
    """A name, key, URL or setting that cannot work; the message says which and why."""


class InvalidRunName(Refused):
    """A run name must be a safe key and path segment."""


class InvalidSetting(Refused):
    """A `DRAFTGEN_*` variable is unknown, or holds a value its setting cannot take; the message names it."""


class UnsafeKey(Refused):
    """A key (from a manifest, a listing) that would name a file outside the output folder."""


class UnsupportedStoreUrl(Refused):
    """The output URL is neither file:// nor s3://."""


class OutputTaken(Refused):
    """The output holds another run's run.json: an output belongs to one run."""


class RecordUnreadable(Refused):
    """A record read back (from Redis) that cannot be trusted: not a whole frame, past its ceiling, or not
    the record it should be. `reason` is a short, stable category; the message says the rest."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RecordTooLarge(Refused):
    """A completion whose record is past the record limit: the uploader would refuse it every time, so it
    is dead-lettered instead of handed over."""


class MalformedMessage(Refused):
    """A queue item, broadcast or event that is not one of draftgen's messages
    (workers/broker/message_check.py): `reason` is one word to count it by, `detail` says what is wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
