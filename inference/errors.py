"""Errors from talking to an SGLang server. The branch says whether a retry helps.

InferenceError
├── InferenceUnavailable   the server could not answer (connection refused or dropped, timeout,
│   │                      5xx): retrying later can help
│   └── ServerNotReady     it did not generate before a readiness deadline (loading, warming up,
│                          or broken: the message carries its log's tail when known)
└── InferenceRejected      the server refused this request (4xx: context overflow, bad sampling
                           values): the same request will be refused again
"""

from __future__ import annotations


class InferenceError(Exception):
    """Root of every error raised while asking a server for a completion."""


class InferenceUnavailable(InferenceError):
    """The server did not produce an answer; a later attempt may succeed."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def server_unreachable(self) -> bool:
        """True when no HTTP answer came at all (refused, dropped, timed out)."""
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
        super().__init__(message)
