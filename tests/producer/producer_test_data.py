"""Helpers of the producer's input tests, shared by conftest.py and the test modules."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa

WriteJsonl = Callable[..., Path]
WriteParquet = Callable[..., Path]
WriteHuggingFaceDataset = Callable[..., Path]


def jsonl_lines(rows: Sequence[object]) -> str:
    """Rows as JSONL; a str row is written as the raw line (for broken and blank lines)."""
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def write_arrow_stream(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
