"""A small synchronous client of the simulator's admin and info routes (stdlib only, for tests)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import msgspec

from inference.simulator.faults import Faults
from inference.simulator.request_log import RequestRecord

DEFAULT_ADMIN_TIMEOUT_S = 10.0


class _RequestList(msgspec.Struct):
    requests: list[RequestRecord]
    total: int


class AdminClient:
    """`AdminClient("http://127.0.0.1:30000")`: faults, the request log, server info, health."""

    def __init__(
        self, url: str, timeout_s: float = DEFAULT_ADMIN_TIMEOUT_S, api_key: str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json"}
        if api_key:  # the admin routes need the key like every other route but the health and metrics
            self._headers["Authorization"] = f"Bearer {api_key}"

    def _call(self, method: str, path: str, body: Any = None) -> bytes:
        data = None if body is None else msgspec.json.encode(body)
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=self._headers)
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            payload: bytes = response.read()
            return payload

    def faults(self) -> Faults:
        return msgspec.json.decode(self._call("GET", "/admin/faults"), type=Faults)

    def set_faults(self, **changes: Any) -> Faults:
        """E.g. `set_faults(error_rate=1.0, error_status=503)`; returns the faults now in force."""
        return msgspec.json.decode(self._call("POST", "/admin/faults", changes), type=Faults)

    def clear_faults(self) -> Faults:
        return self.set_faults(**msgspec.structs.asdict(Faults()))

    def requests(self, rid: str | None = None) -> list[RequestRecord]:
        """Finished or failed chat requests, oldest first (only those with `rid` if given)."""
        path = "/admin/requests" + ("" if rid is None else "?" + urllib.parse.urlencode({"rid": rid}))
        return msgspec.json.decode(self._call("GET", path), type=_RequestList).requests

    def reset_requests(self) -> int:
        cleared: int = msgspec.json.decode(self._call("POST", "/admin/reset", {}))["cleared"]
        return cleared

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = msgspec.json.decode(self._call("GET", "/server_info"))
        return info

    def health_status(self) -> int | None:
        """The status of GET /health, or None when the port refuses connections."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=self.timeout_s) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None
