"""Plain synchronous questions to an SGLang server (or the simulator): its health, its `/server_info`,
its speculative accept length. For threads beside the worker's event loop (heartbeat, facts)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from inference.metrics_reader import parse_metrics

HEALTH_TIMEOUT_S = 3.0  # SGLang's /health runs a real one-token generation: slower under load
INFO_TIMEOUT_S = 2.0
HTTP_OK = 200


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
    """Asks an SGLang server (or the simulator) for its health and speculative accept length."""

    server_url: str
    api_key: str | None = None

    def _get(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        request = urllib.request.Request(self.server_url.rstrip("/") + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as error:
            return int(error.code), b""

    def health(self) -> int | None:
        try:
            return self._get("/health", HEALTH_TIMEOUT_S)[0]
        except OSError:  # refused, reset, timed out
            return None

    def server_info(self) -> dict[str, Any] | None:
        """The `/server_info` body; None when the server does not answer it (down, older, foreign)."""
        try:
            status, body = self._get("/server_info", INFO_TIMEOUT_S)
            info = json.loads(body) if status == HTTP_OK else None
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def accept_length(self) -> float | None:
        """From /server_info; else from /metrics (served only with --enable-metrics)."""
        try:
            status, body = self._get("/server_info", INFO_TIMEOUT_S)
            if status == HTTP_OK:
                value = accept_length_from_server_info(json.loads(body))
                if value is not None:
                    return value
            status, body = self._get("/metrics", INFO_TIMEOUT_S)
        except (OSError, ValueError):
            return None
        if status != HTTP_OK:
            return None
        try:
            return parse_metrics(body.decode(errors="replace")).spec_accept_length
        except ValueError:  # not Prometheus text
            return None
