"""Errors of the producer side. A bad row never raises: it becomes a `RejectedRow`.

ProducerError
├── SourceError       the DATA argument cannot be read at all (missing, unknown type, unreadable)
├── SettingsError     the run's settings are invalid, or differ from the ones pinned at its start
├── RunNotFound       the named run was never enqueued
├── EnqueueBusy       another `enqueue` of the same run is at work
└── RedisUnavailable  Redis could not be reached or refused a command (status, pause, resume)
"""

from __future__ import annotations


class ProducerError(Exception):
    """Root of the producer-side errors."""


class SourceError(ProducerError):
    """The DATA argument cannot be read at all: the whole source is unusable, not one row."""


class SettingsError(ProducerError):
    """The run's settings are invalid, or differ from the ones pinned at its first enqueue."""


class RunNotFound(ProducerError):
    """No run of that name exists in Redis."""


class EnqueueBusy(ProducerError):
    """Another `enqueue` of the same run holds its enqueue lease: two at once could batch a prompt twice."""


class RedisUnavailable(ProducerError):
    """Redis could not be reached, or refused a command."""
