"""Plain synchronous questions to an SGLang server (or the simulator): `/health`, `/metrics`,
`/server_info`. One HTTP stack (urllib, which logs nothing: a question every few seconds must not
flood a log) for the worker's heartbeat, server facts and liveness, and the node's readiness and
preflight. Generation itself goes through `inference.client`."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from inference.errors import (
    FailureCause,
    InferenceError,
    InferenceRejected,
    InferenceUnavailable,
    transport_cause,
)
from inference.metrics_reader import MetricsSnapshot, parse_metrics

HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
SERVER_INFO_PATH = "/server_info"
HEALTH_TIMEOUT_S = 3.0  # SGLang's /health runs a real one-token generation: slower under load
INFO_TIMEOUT_S = 2.0
DEFAULT_METRICS_TIMEOUT_S = 10.0
"""For the connection and for each read. /metrics is served by the HTTP process from the scheduler's
shared files: it answers in milliseconds, even with the GPU saturated."""
HTTP_OK = 200
HTTP_SERVER_ERROR = 500


def accept_length_from_server_info(info: object) -> float | None:
    """`internal_states[0].avg_spec_accept_length` of SGLang's /server_info, when present."""
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states")
    if not isinstance(states, list) or not states or not isinstance(states[0], dict):
        return None
    value = states[0].get("avg_spec_accept_length")
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class ServerProbe:
    """Asks one SGLang server (or the simulator) how it is, without generating anything."""

    server_url: str
    api_key: str | None = None

    def get(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        """The status and body of GET `path`; an HTTP error status is an answer too.

        Raises OSError (refused, reset, timed out) when no answer came."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        request = urllib.request.Request(self.server_url.rstrip("/") + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as error:
            return int(error.code), b""

    def health(self, timeout_s: float = HEALTH_TIMEOUT_S) -> int | None:
        """`/health`'s status; None when no answer came."""
        try:
            return self.get(HEALTH_PATH, timeout_s)[0]
        except OSError:
            return None

    def _body(self, path: str, timeout_s: float) -> tuple[str, bytes]:
        """The URL and body of GET `path` when it answered 200. Raises InferenceUnavailable when no
        usable answer came (refused, timed out, 5xx), InferenceRejected when it answered 4xx."""
        url = self.server_url.rstrip("/") + path
        try:
            status, body = self.get(path, timeout_s)
        except OSError as error:
            raise InferenceUnavailable(
                f"GET {url}: {type(error).__name__}: {error}", cause=transport_cause(error)
            ) from error
        if status == HTTP_OK:
            return url, body
        message = f"GET {url} answered {status}"
        if status < HTTP_SERVER_ERROR:
            raise InferenceRejected(message, status=status)
        raise InferenceUnavailable(message, status=status)

    def read_server_info(self, timeout_s: float = INFO_TIMEOUT_S) -> dict[str, Any]:
        """The `/server_info` body. Raises InferenceError, saying why, when there is none."""
        url, body = self._body(SERVER_INFO_PATH, timeout_s)
        try:
            info = json.loads(body)
        except ValueError as error:
            raise InferenceUnavailable(
                f"GET {url}: not JSON: {error}", status=HTTP_OK, cause=FailureCause.MALFORMED
            ) from error
        if not isinstance(info, dict):
            raise InferenceUnavailable(
                f"GET {url}: not a JSON object", status=HTTP_OK, cause=FailureCause.MALFORMED
            )
        return info

    def server_info(self, timeout_s: float = INFO_TIMEOUT_S) -> dict[str, Any] | None:
        """The `/server_info` body; None when the server does not answer it (down, older, foreign)."""
        try:
            return self.read_server_info(timeout_s)
        except InferenceError:
            return None

    def metrics(self, timeout_s: float = DEFAULT_METRICS_TIMEOUT_S) -> MetricsSnapshot:
        """Scrape `/metrics` (SGLang never asks a key for it; sending one does no harm). Raises as `_body`
        does, and InferenceUnavailable for a body that is not Prometheus text; a 404 means the server
        runs without `--enable-metrics`."""
        url, body = self._body(METRICS_PATH, timeout_s)
        try:
            return parse_metrics(body.decode("utf-8", errors="replace"))
        except ValueError as error:
            raise InferenceUnavailable(
                f"GET {url}: not Prometheus text: {error}", cause=FailureCause.MALFORMED
            ) from error

    def accept_length(self) -> float | None:
        """From /server_info; else from /metrics (served only with --enable-metrics)."""
        value = accept_length_from_server_info(self.server_info())
        if value is not None:
            return value
        try:
            return self.metrics(INFO_TIMEOUT_S).spec_accept_length
        except InferenceError:
            return None
