"""Errors of what a run reads, one tree. A bad row never raises: it becomes a `RejectedRow`.

IntakeError             retrying cannot help: what the user gave must change
└── SourceError         DATA cannot be read at all (missing, empty, unknown type, unreadable)
    └── SourceUnavailable  retrying helps: DATA's S3 store cannot be reached or refused (credentials,
                           network, access); the same for an output (the producer's OutputUnavailable)

The producer reports them as its usage errors (producer/errors.py), preflight as option errors.
"""

from __future__ import annotations

from typing import ClassVar


class IntakeError(Exception):
    retry_helps: ClassVar[bool] = False


class SourceError(IntakeError):
    """The DATA argument cannot be read at all: the whole source is unusable, not one row."""


class SourceUnavailable(SourceError):
    """DATA's object store could not be reached, or refused the request (credentials, access, network)."""

    retry_helps: ClassVar[bool] = True
