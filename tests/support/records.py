"""Small builders of records for tests."""

from __future__ import annotations

import sys

from core.records import (
    Completion,
    Message,
    Origin,
    Prompt,
    Quality,
    SamplingSettings,
    Timings,
    Usage,
)

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd


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


BOMB_CHUNK_BYTES = 1 << 20


def zstd_bomb(prompt_id: str, *, inflates_to_bytes: int) -> bytes:
    """A staged record of a few KB that inflates to `inflates_to_bytes`: a stream whose frame declares no
    size, so only a decompressor with a ceiling stops it."""
    compressor = zstd.ZstdCompressor(level=3)
    chunks = [compressor.compress(b'{"prompt_id":"' + prompt_id.encode() + b'","content":"')]
    chunk = b"a" * BOMB_CHUNK_BYTES
    chunks += [compressor.compress(chunk) for _ in range(inflates_to_bytes // BOMB_CHUNK_BYTES)]
    return b"".join(chunks) + compressor.flush()
