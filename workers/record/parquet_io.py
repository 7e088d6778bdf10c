"""Completions as Parquet (zstd inside): readable by pandas, pyarrow and Hugging Face `datasets` alike."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from core.kept_columns import KIND_BOOLEAN, KIND_FLOAT, KIND_INTEGER, KIND_JSON, KIND_STRING
from core.records import Completion
from workers.record.arrow_schema import arrow_schema

PARQUET_COMPRESSION = "zstd"
# pyarrow 26 can abort the process at exit ("terminate called without an active exception") after a
# threaded read; objects are at most a few MB, so a single-threaded read costs nothing that matters.
PARQUET_USE_THREADS = False

# The output's columns: every field of the completion record, as it declares them (workers/record/
# arrow_schema.py). A conversation regenerated turn by turn has its turns before the last in
# `earlier_turns` (the row's own fields are the last turn's); token ids are int32, null when the server
# gave none.
# A run's kept input columns are one struct column, `columns`, of the types pinned with the run
# (core/kept_columns.py); a run that keeps none has no such column.
KEPT_COLUMNS_FIELD = "columns"
COMPLETION_SCHEMA = arrow_schema(Completion, leave_out=(KEPT_COLUMNS_FIELD,))
KIND_ARROW_TYPES = {
    KIND_STRING: pa.string(),
    KIND_INTEGER: pa.int64(),
    KIND_FLOAT: pa.float64(),
    KIND_BOOLEAN: pa.bool_(),
    KIND_JSON: pa.string(),  # the value's JSON text
}


def completion_schema(column_types: Mapping[str, str] | None) -> pa.Schema:
    """The Parquet columns of a run's completions: the record's, and its kept columns' struct."""
    if not column_types:
        return COMPLETION_SCHEMA
    kept = pa.struct([(name, KIND_ARROW_TYPES[kind]) for name, kind in column_types.items()])
    return COMPLETION_SCHEMA.append(pa.field(KEPT_COLUMNS_FIELD, kept))


def completions_to_parquet(
    completions: list[Completion], column_types: Mapping[str, str] | None = None
) -> bytes:
    return records_to_parquet(completions, completion_schema(column_types))


def records_to_parquet(records: Sequence[msgspec.Struct], schema: pa.Schema) -> bytes:
    """Records as one Parquet object, in the columns of `schema` (their type's `arrow_schema`)."""
    table = pa.Table.from_pylist([msgspec.to_builtins(record) for record in records], schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression=PARQUET_COMPRESSION)
    return sink.getvalue()


def prompt_ids_in(data: bytes) -> list[str]:
    table = pq.read_table(io.BytesIO(data), columns=["prompt_id"], use_threads=PARQUET_USE_THREADS)
    column = table.column("prompt_id")
    return [str(value) for value in column.to_pylist()]


def read_completions(data: bytes) -> list[Completion]:
    rows = pq.read_table(io.BytesIO(data), use_threads=PARQUET_USE_THREADS).to_pylist()
    return [msgspec.convert(row, type=Completion) for row in rows]
