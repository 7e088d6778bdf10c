"""Completions as Parquet (zstd inside): readable by pandas, pyarrow and Hugging Face `datasets` alike."""

from __future__ import annotations

import io

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from inference.records import Completion

PARQUET_COMPRESSION = "zstd"
# pyarrow 26 can abort the process at exit ("terminate called without an active exception") after a
# threaded read; objects are at most a few MB, so a single-threaded read costs nothing that matters.
PARQUET_USE_THREADS = False

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
_USAGE = pa.struct(
    [
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("reasoning_tokens", pa.int64()),
    ]
)
_TIMINGS = pa.struct(
    [("started_at", pa.float64()), ("finished_at", pa.float64()), ("latency_s", pa.float64())]
)
# Token ids fit int32 (vocabularies hold under 2**31 entries); null when the server gave none.
_TOKEN_IDS = pa.list_(pa.int32())
_TURN = pa.struct(
    [
        ("reasoning_content", pa.string()),
        ("content", pa.string()),
        ("finish_reason", pa.string()),
        ("quality", pa.string()),
        ("usage", _USAGE),
        ("timings", _TIMINGS),
        ("max_tokens", pa.int64()),
        ("attempt", pa.int64()),
        ("budget_retries", pa.int64()),
        ("spec_accept_length", pa.float64()),
        ("prompt_token_ids", _TOKEN_IDS),
        ("response_token_ids", _TOKEN_IDS),
    ]
)
COMPLETION_SCHEMA = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("messages", pa.list_(_MESSAGE)),
        ("reasoning_content", pa.string()),
        ("content", pa.string()),
        ("finish_reason", pa.string()),
        ("quality", pa.string()),
        ("usage", _USAGE),
        ("timings", _TIMINGS),
        ("model", pa.string()),
        (
            "sampling",
            pa.struct(
                [
                    ("model", pa.string()),
                    ("temperature", pa.float64()),
                    ("top_p", pa.float64()),
                    ("top_k", pa.int64()),
                    ("min_p", pa.float64()),
                    ("max_tokens", pa.int64()),
                    ("enable_thinking", pa.bool_()),
                    ("seed", pa.int64()),
                ]
            ),
        ),
        (
            "origin",
            pa.struct(
                [
                    ("host", pa.string()),
                    ("gpu", pa.int64()),
                    ("server_url", pa.string()),
                    ("server", pa.string()),
                ]
            ),
        ),
        ("attempt", pa.int64()),
        ("spec_accept_length", pa.float64()),
        ("budget_retries", pa.int64()),
        ("prompt_token_ids", _TOKEN_IDS),
        ("response_token_ids", _TOKEN_IDS),
        # A conversation regenerated turn by turn: its turns before the last (the row's own fields are
        # the last turn's), and its user turns. Empty and 1 for a one-request prompt.
        ("earlier_turns", pa.list_(_TURN)),
        ("conversation_turns", pa.int64()),
    ]
)


def completions_to_parquet(completions: list[Completion]) -> bytes:
    table = pa.Table.from_pylist([msgspec.to_builtins(c) for c in completions], schema=COMPLETION_SCHEMA)
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
