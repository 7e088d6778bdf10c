"""Errors from talking to an SGLang server. The branch says whether a retry helps.

InferenceError
├── InferenceUnavailable   the server could not answer (connection refused or dropped, timeout,
│   │                      5xx, a request cut for silence): retrying later can help; its `cause`
│   │                      says which, for a caller telling one request's failure from a server down
│   └── ServerNotReady     it did not generate before a readiness deadline (loading, warming up,
│                          or broken: the message carries its log's tail when known)
└── InferenceRejected      the server refused this request (4xx: context overflow, bad sampling
                           values): the same request will be refused again
"""

from __future__ import annotations

import enum
import errno
import socket
from http import HTTPStatus

# errnos of a connection that was never made (beside ConnectionRefusedError's own)
_NO_CONNECTION_ERRNOS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH})
HTTP_INTERNAL_SERVER_ERROR = HTTPStatus.INTERNAL_SERVER_ERROR.value
RETRYABLE_CLIENT_STATUSES = frozenset({408, 409, 429})  # timeouts and throttling: not the request's fault


class FailureCause(enum.StrEnum):
    """Why no answer came, in a word a program can act on."""

    REFUSED = "refused"  # no connection at all: refused, unreachable, unresolvable
    DROPPED = "dropped"  # the connection was reset or closed mid-request, or a stream ended unfinished
    SILENT = "silent"  # cut by the caller: silent for its limit while the server generated for others
    TIMED_OUT = "timed_out"  # the client's own timeout ran out
    HTTP = "http"  # the server answered an error status (before the stream, or as an error event in it)
    MALFORMED = "malformed"  # the server answered 200, but not in a shape that makes an answer
    ABANDONED = "abandoned"  # the caller gave the request up: server suspended, worker stopping


class InferenceError(Exception):
    """Root of every error raised while asking a server for a completion."""


class InferenceUnavailable(InferenceError):
    """The server did not produce an answer; a later attempt may succeed.

    `cause` defaults to HTTP when a status is given and to DROPPED otherwise; every raiser in draftgen
    names it."""

    def __init__(self, message: str, *, status: int | None = None, cause: FailureCause | None = None) -> None:
        super().__init__(message)
        self.status = status
        if cause is None:
            cause = FailureCause.HTTP if status is not None else FailureCause.DROPPED
        self.cause = cause

    @property
    def server_unreachable(self) -> bool:
        """True when no HTTP error status came (refused, dropped, timed out, silent, abandoned)."""
        return self.status is None


class InferenceRejected(InferenceError):
    """The server answered that this request is invalid; retrying it is pointless."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class ServerNotReady(InferenceUnavailable):
    """A server did not answer a real generation before the readiness deadline."""

    def __init__(self, url: str, reason: str, log_tail: str | None) -> None:
        self.url = url
        self.reason = reason
        self.log_tail = log_tail
        message = f"SGLang server at {url} is not ready: {reason}"
        if log_tail is not None:
            message += f"\nlast lines of its log:\n{log_tail}"
        super().__init__(message, cause=FailureCause.TIMED_OUT)


def retry_helps(status: int) -> bool:
    return status >= HTTP_INTERNAL_SERVER_ERROR or status in RETRYABLE_CLIENT_STATUSES


def status_error(status: int, text: str) -> InferenceError:
    """The error for an HTTP error status: unavailable when a retry can help, else rejected."""
    if retry_helps(status):
        return InferenceUnavailable(text, status=status, cause=FailureCause.HTTP)
    return InferenceRejected(text, status=status)


def transport_cause(error: BaseException) -> FailureCause:
    """The cause of an exception raised by a transport (socket, urllib, aiohttp, httpx) from its chain:
    REFUSED when no connection was made, TIMED_OUT when the innermost error is a timeout, else DROPPED."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        reason = getattr(current, "reason", None)  # urllib's URLError keeps the socket's error here
        current = (
            current.__cause__
            or current.__context__
            or (reason if isinstance(reason, BaseException) else None)
        )
    for link in chain:
        if isinstance(link, ConnectionRefusedError | socket.gaierror) or (
            isinstance(link, OSError) and link.errno in _NO_CONNECTION_ERRNOS
        ):
            return FailureCause.REFUSED
    if isinstance(chain[-1], TimeoutError):
        return FailureCause.TIMED_OUT
    return FailureCause.DROPPED
