"""What an output store does, whatever holds it: a local folder (workers/record/storage.py) or S3
(workers/record/s3_store.py). Keys are relative paths such as `data/part-….parquet`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified_at: float  # unix seconds


class ObjectStore(Protocol):
    url: str

    def put(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def put_if_absent(self, key: str, data: bytes) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def list(self, prefix: str) -> Iterator[ObjectInfo]: ...
    def delete(self, key: str) -> None: ...
