"""A recoverable event is one log line: Celery and kombu log a lost broker connection with its whole
exception chain (a Redis restart left six tracebacks in an uploader's log for one event, and a dozen
more per restart across a node), while the worker rides it out by design. A record whose exception
chain holds a connection error keeps its message and gains the error's last line; the traceback is
dropped. Any other exception keeps its traceback: that one is a bug to read."""

from __future__ import annotations

import logging

import redis
from kombu.exceptions import OperationalError

RECOVERABLE_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
    ConnectionError,
    TimeoutError,
    OperationalError,
)
CHAIN_DEPTH_LIMIT = 16  # exceptions followed through __cause__ and __context__


def recoverable_cause(error: BaseException | None) -> BaseException | None:
    """The connection error in `error`'s chain (itself, its cause or its context), or None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen and len(seen) < CHAIN_DEPTH_LIMIT:
        if isinstance(error, RECOVERABLE_ERRORS):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class RecoverableOneLine(logging.Filter):
    """Turns a record of a recoverable connection error into one line (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        cause = recoverable_cause(error)
        if cause is None:
            return True
        record.msg = f"{record.getMessage()} [{type(cause).__name__}: {cause}; recoverable, retried]"
        record.args = None
        record.exc_info = None
        record.exc_text = None
        return True


def one_line_for_recoverable_errors(logger: logging.Logger) -> None:
    """Add the filter to every handler of `logger` (Celery's root logger, once it set it up)."""
    for handler in logger.handlers:
        if not any(isinstance(existing, RecoverableOneLine) for existing in handler.filters):
            handler.addFilter(RecoverableOneLine())
