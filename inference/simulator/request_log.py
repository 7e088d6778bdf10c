"""The log of requests the server finished or failed, for `GET /admin/requests`."""

from __future__ import annotations

import collections
from typing import Any

import msgspec


class RequestRecord(msgspec.Struct, kw_only=True):
    """One chat request as received and as it ended.

    status: "ok" (answered 200, see finish_reason), "rejected" (4xx from validation or a full queue),
    "error" (injected 500/503), "hung" (never answered, client gave up), "dropped" (connection
    closed by the simulator), "cancelled" (client disconnected before the end).
    """

    rid: str
    messages_hash: str
    max_tokens: int | None
    max_completion_tokens: int | None
    sampling: dict[str, Any]  # every sampling/output field present in the body, as received
    stream: bool
    status: str = "ok"
    http_status: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, found in the server's prefix cache (at its last admission)
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    received_at: float = 0.0  # Unix time
    first_token_at: float | None = None
    finished_at: float | None = None
    messages: list[dict[str, Any]] | None = None  # as received, with --log-request-messages


class RequestLog:
    """The last `size` records, oldest first."""

    def __init__(self, size: int) -> None:
        self._records: collections.deque[RequestRecord] = collections.deque(maxlen=size)
        self.total = 0

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)
        self.total += 1

    def records(self, rid: str | None = None) -> list[RequestRecord]:
        return [record for record in self._records if rid is None or record.rid == rid]

    def clear(self) -> int:
        cleared = len(self._records)
        self._records.clear()
        self.total = 0
        return cleared
