"""JSONL shards written byte for byte the same on every run: the same rows give the same files.

A shard holds `shard_rows` consecutive exported rows (the last one the rest). It is written to a
local temporary file through its compressor, then put in the destination whole: an object that
exists is complete. gzip is written without a name or a time in its header and zstd at a fixed
level, so a shard's bytes depend on its rows alone, and an export re-run after a crash rewrites
exactly the shards that were missing.
"""

from __future__ import annotations

import enum
import gzip
import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import msgspec
from backports import zstd

from workers.record.object_store import ObjectStore

DEFAULT_SHARD_ROWS = 10_000  # a few hundred MB of reasoning rows with their ids, at most
SHARDS_PREFIX = "data/"
ZSTD_LEVEL = 10
GZIP_LEVEL = 6
COPY_CHUNK_BYTES = 1 << 20


class Compression(enum.StrEnum):
    NONE = "none"
    GZIP = "gz"
    ZSTD = "zst"

    @property
    def suffix(self) -> str:
        return ".jsonl" if self is Compression.NONE else f".jsonl.{self.value}"


def shard_key(index: int, total: int, compression: Compression) -> str:
    """Hugging Face's shard naming, so `data/train-*` is the train split."""
    return f"{SHARDS_PREFIX}train-{index:05d}-of-{total:05d}{compression.suffix}"


def shard_count(rows: int, shard_rows: int) -> int:
    return max(1, -(-rows // shard_rows))


class ShardDone(msgspec.Struct, frozen=True):
    key: str
    rows: int
    bytes: int
    sha256: str


def _open_compressed(raw: IO[bytes], compression: Compression) -> BinaryIO:
    stream: Any = raw
    if compression is Compression.GZIP:
        stream = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0)
    elif compression is Compression.ZSTD:
        stream = zstd.ZstdFile(raw, "wb", level=ZSTD_LEVEL)
    return cast(BinaryIO, stream)


@dataclass
class ShardWriter:
    """Rows in, one shard out: `add` each row's JSON-ready dict, then `finish` to put it."""

    key: str
    _encoder: msgspec.json.Encoder
    _raw: IO[bytes]  # a named local temporary file, deleted on close
    _stream: BinaryIO
    rows: int = 0

    @classmethod
    def open(cls, key: str, compression: Compression) -> ShardWriter:
        raw = tempfile.NamedTemporaryFile(prefix="draftgen-shard-")  # noqa: SIM115 (closed by finish)
        return cls(key, msgspec.json.Encoder(), raw, _open_compressed(raw, compression))

    def add(self, row: dict[str, Any]) -> None:
        self._stream.write(self._encoder.encode(row))
        self._stream.write(b"\n")
        self.rows += 1

    def finish(self, store: ObjectStore) -> ShardDone:
        if self._stream is not self._raw:
            self._stream.close()  # ends the compressed stream; the file it wrote to stays open
        self._raw.flush()
        path = Path(self._raw.name)
        digest, size = hashlib.sha256(), 0
        with path.open("rb") as written:
            while chunk := written.read(COPY_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
        store.put_file(self.key, path)
        self._raw.close()
        return ShardDone(key=self.key, rows=self.rows, bytes=size, sha256=digest.hexdigest())

    def discard(self) -> None:
        self._raw.close()
