"""Input files made to hurt the head node, each small on disk (issue 25): built here for the tests of
tests/producer/test_crafted_inputs.py and for benchmarks/bench_crafted_inputs.py.

Each builder writes its file and returns its path; the sizes are what reading them would cost without
the bounds of intake/limits.py.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

MIB = 1024 * 1024
WRITE_CHUNK_BYTES = 16 * MIB
BOMB_LINE_BYTES = 1024 * MIB  # one line of a zstd bomb; 99 KB on disk
GZIP_BOMB_LINE_BYTES = 256 * MIB  # gzip inflates at most 1032x: 256 MB are 250 KB on disk
NESTING_LEVELS = 100_000  # a JSON row of 100,000 nested arrays, 200 KB
HUGE_ROW_BYTES = 50 * MIB
PARQUET_HUGE_CELL_BYTES = 64 * MIB  # one cell, a few KB of zstd
DICTIONARY_VALUE_BYTES = 4 * MIB  # one value every row repeats: stored once, read on each row
DICTIONARY_ROWS = 200
GOOD_ROW = {"id": "good", "prompt": "What is 2 + 2?"}
AFTER_ROW = {"id": "after", "prompt": "What is 3 + 3?"}


def _line(record: object) -> bytes:
    return json.dumps(record).encode() + b"\n"


def _one_long_line(stream: object, line_bytes: int) -> None:
    write = stream.write  # type: ignore[attr-defined]
    write(b'{"prompt": "')
    chunk = b"a" * WRITE_CHUNK_BYTES
    for _ in range(line_bytes // WRITE_CHUNK_BYTES):
        write(chunk)
    write(b'"}\n')


def zstd_bomb(folder: Path) -> Path:
    path = folder / "bomb.jsonl.zst"
    with zstd.ZstdFile(path, "wb", level=1) as stream:
        _one_long_line(stream, BOMB_LINE_BYTES)
    return path


def gzip_bomb(folder: Path) -> Path:
    path = folder / "bomb.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=9) as stream:
        _one_long_line(stream, GZIP_BOMB_LINE_BYTES)
    return path


def deep_nesting(folder: Path) -> Path:
    path = folder / "nested.jsonl"
    deep = b'{"prompt": "hi", "extra": ' + b"[" * NESTING_LEVELS + b"]" * NESTING_LEVELS + b"}\n"
    path.write_bytes(_line(GOOD_ROW) + deep)
    return path


def huge_row(folder: Path) -> Path:
    path = folder / "huge-row.jsonl"
    with path.open("wb") as stream:
        stream.write(_line(GOOD_ROW))
        stream.write(_line({"id": "huge", "prompt": "a" * HUGE_ROW_BYTES}))
        stream.write(_line(AFTER_ROW))  # reading goes on past the rejected row
    return path


def parquet_huge_cell(folder: Path) -> Path:
    path = folder / "huge-cell.parquet"
    table = pa.table({"id": ["huge"], "prompt": ["a" * PARQUET_HUGE_CELL_BYTES]})
    pq.write_table(table, path, compression="zstd")
    return path


def parquet_dictionary_bomb(folder: Path) -> Path:
    """Every row repeats one long value: a dictionary page holds it once."""
    path = folder / "dictionary.parquet"
    prompts = pa.DictionaryArray.from_arrays(
        pa.array([0] * DICTIONARY_ROWS, pa.int32()), pa.array(["a" * DICTIONARY_VALUE_BYTES])
    )
    pq.write_table(pa.table({"prompt": prompts}), path, compression="zstd")
    return path


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "zstd-bomb": zstd_bomb,
    "gzip-bomb": gzip_bomb,
    "deep-nesting": deep_nesting,
    "huge-row": huge_row,
    "parquet-huge-cell": parquet_huge_cell,
    "parquet-dictionary-bomb": parquet_dictionary_bomb,
}
