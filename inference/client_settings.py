"""How to reach one SGLang server: the client's settings, apart from the client itself so that
settings can be built and checked without importing openai (a second of start-up)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_REQUEST_TIMEOUT_S = 1200.0  # a 32k-token thinking trace at ~40 tokens/s per request fits
DEFAULT_CONNECT_TIMEOUT_S = 5.0
PLACEHOLDER_API_KEY = "EMPTY"  # the openai client insists on a key; SGLang without --api-key ignores it


@dataclass(frozen=True)
class ClientSettings:
    server_url: str  # http://host:port, without /v1
    api_key: str | None = None
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    max_connections: int = 256

    def __repr__(self) -> str:
        key = "***" if self.api_key else None
        return (
            f"ClientSettings(server_url={self.server_url!r}, api_key={key!r}, "
            f"request_timeout_s={self.request_timeout_s}, connect_timeout_s={self.connect_timeout_s})"
        )
