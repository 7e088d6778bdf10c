"""Small builders of records for tests."""

from __future__ import annotations

from inference.records import (
    Completion,
    Message,
    Origin,
    Prompt,
    Quality,
    SamplingSettings,
    Timings,
    Usage,
)


def prompt(prompt_id: str, text: str | None = None, row: int = 1, file: str = "") -> Prompt:
    return Prompt(
        id=prompt_id,
        messages=[Message(role="user", content=text or f"question {prompt_id}")],
        row=row,
        file=file,
    )


def completion(prompt_id: str, *, content: str = "\n\nanswer", size: int = 0) -> Completion:
    return Completion(
        prompt_id=prompt_id,
        messages=[Message(role="user", content=f"question {prompt_id}")],
        reasoning_content="\nthought " * max(size, 1),
        content=content,
        finish_reason="stop",
        usage=Usage(prompt_tokens=5, completion_tokens=10, reasoning_tokens=7),
        timings=Timings(started_at=1.0, finished_at=2.0, latency_s=1.0),
        model="m",
        sampling=SamplingSettings(model="m"),
        origin=Origin(host="h", gpu=0, server_url="http://127.0.0.1:30000"),
        attempt=1,
        quality=Quality.OK,
    )
