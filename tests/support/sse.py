"""Server-sent event bodies for fake servers (httpx.MockTransport): the frames SGLang streams."""

from __future__ import annotations

import json
from typing import Any

import httpx

DONE = "[DONE]"


def chunk(
    delta: dict[str, Any] | None = None, *, finish_reason: str | None = None, **top: Any
) -> dict[str, Any]:
    """A `chat.completion.chunk`: one choice with `delta` (and `finish_reason`), or `choices: []` with
    `top`'s keys (`usage`, `sglext`) when `delta` is None."""
    choices = (
        []
        if delta is None
        else [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": None,
            }
        ]
    )
    return {
        "id": "r1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "default",
        "choices": choices,
        **top,
    }


def event_stream(*events: dict[str, Any] | str) -> httpx.Response:
    """A 200 `text/event-stream` answer made of `data:` events (a string is sent as it is, e.g. DONE)."""
    body = "".join(f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n" for event in events)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())
