"""Every InferenceUnavailable says why, as a word a program can act on: a server that was never reached
(refused) is told from a request that failed on its own (dropped, silent, an HTTP error status)."""

from __future__ import annotations

import errno
import socket
import urllib.error

import pytest

from inference.errors import FailureCause, InferenceUnavailable, ServerNotReady, transport_cause


def raised_from(cause: BaseException, outer: type[Exception] = RuntimeError) -> BaseException:
    """`outer`, raised from `cause`, as a transport wraps the socket's error."""
    try:
        try:
            raise cause
        except BaseException as inner:
            raise outer("wrapped") from inner
    except Exception as error:
        return error


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (raised_from(ConnectionRefusedError(errno.ECONNREFUSED, "refused")), FailureCause.REFUSED),
        (urllib.error.URLError(ConnectionRefusedError(errno.ECONNREFUSED, "refused")), FailureCause.REFUSED),
        (raised_from(socket.gaierror(socket.EAI_NONAME, "unknown host")), FailureCause.REFUSED),
        (raised_from(OSError(errno.EHOSTUNREACH, "no route to host")), FailureCause.REFUSED),
        (raised_from(TimeoutError("timed out")), FailureCause.TIMED_OUT),
        (raised_from(ConnectionResetError(errno.ECONNRESET, "reset")), FailureCause.DROPPED),
        (raised_from(ValueError("payload cut short")), FailureCause.DROPPED),
    ],
    ids=["refused", "urllib refused", "unresolvable", "unreachable", "timed out", "reset", "cut short"],
)
def test_a_transport_error_is_told_by_its_innermost_cause(error: BaseException, cause: FailureCause) -> None:
    assert transport_cause(error) is cause


def test_an_unavailable_server_s_cause_follows_its_status_unless_named() -> None:
    assert InferenceUnavailable("HTTP 503: busy", status=503).cause is FailureCause.HTTP
    assert InferenceUnavailable("the connection closed").cause is FailureCause.DROPPED
    silent = InferenceUnavailable("silent for 30 s", cause=FailureCause.SILENT)
    assert silent.cause is FailureCause.SILENT and silent.server_unreachable
    assert not InferenceUnavailable("HTTP 500", status=500).server_unreachable
    assert ServerNotReady("http://gpu-0:30000", "still loading", None).cause is FailureCause.TIMED_OUT
