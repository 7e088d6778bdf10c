"""Records as JSON Lines: the dead letters, rejected rows and enqueued ids kept in the object store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import msgspec

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


def to_jsonl(records: Iterable[object]) -> bytes:
    return b"".join(_encoder.encode(record) + b"\n" for record in records)


def from_jsonl(data: bytes, kind: type[T]) -> list[T]:
    decoder = msgspec.json.Decoder(kind)
    return [decoder.decode(line) for line in data.splitlines() if line.strip()]
