"""Open a DATA argument and stream its rows, one decoded row at a time, with flat memory.

DATA is one of:
- a JSONL file: `.jsonl`, `.jsonl.gz` or `.jsonl.zst`, read line by line;
- a Parquet file (`.parquet`), read in record batches of `ROWS_PER_BATCH`, only the wanted columns;
- a folder: every JSONL or Parquet file under it, recursively, in sorted path order. Names starting
  with "." or "_" (hidden files, _SUCCESS, _metadata) and side files (`SIDE_FILE_SUFFIXES`,
  `SIDE_FILE_NAMES`) are skipped; any other file (a `.json`, a `.csv`) is an error rather than
  data silently left out;
- a Hugging Face `datasets` folder written by `Dataset.save_to_disk` (it has a `state.json`): its
  `.arrow` shards, Arrow IPC streams, in the order `state.json` lists them. `datasets` itself is
  not needed. A `DatasetDict` folder is refused: pass one split's folder;
- any of the above on S3: `s3://bucket/key` for a file, `s3://bucket/prefix/` (trailing slash)
  for a folder. The client comes from `s3_client_factory`, by default `inference.s3.s3_client()`, so the
  standard AWS chain applies (credentials, region, AWS_ENDPOINT_URL). An object is streamed, never
  downloaded whole; a dropped connection resumes at the same byte, pinned to the object's ETag.

Row numbers: the physical line number in a JSONL file (blank lines are skipped, not renumbered,
so an editor opens the file at the right line), the 1-based row index in a Parquet or Arrow file.
A row that cannot be decoded is yielded as an `UnreadableRow`; only a source that cannot be read at
all raises `SourceError`. Opening is eager (a missing file fails at the call, not at the first
row); reading is lazy. A file that breaks part-way (a truncated .gz, a corrupt Parquet page) raises
`SourceError` naming the last row read: the rows before it were good and stay yielded.

Where the files are (a folder, an S3 bucket) is `intake/input_stores.py`; this module finds the
data files among them and reads their rows.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from botocore.exceptions import BotoCoreError

from inference.s3 import S3_SCHEME
from inference.safe_paths import stays_inside
from intake.errors import SourceError
from intake.input_stores import (
    InputFiles,
    LocalInputFiles,
    S3ClientFactory,
    S3InputFiles,
    default_s3_client,
)

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

ROWS_PER_BATCH = 1024  # rows decoded to Python at a time from Parquet/Arrow
UTF8_BOM = b"\xef\xbb\xbf"
HF_STATE_FILE = "state.json"
HF_DATASET_DICT_FILE = "dataset_dict.json"
SIDE_FILE_SUFFIXES = (".md", ".txt", ".yaml", ".yml", ".crc")
SIDE_FILE_NAMES = frozenset({"dataset_info.json", "dataset_infos.json", "config.json"})
SKIPPED_NAME_PREFIXES = (".", "_")


class FileKind(Enum):
    JSONL = "jsonl"
    JSONL_GZIP = "jsonl.gz"
    JSONL_ZSTD = "jsonl.zst"
    PARQUET = "parquet"
    ARROW_STREAM = "arrow"  # the shards of a Hugging Face save_to_disk folder


SUFFIX_KINDS = {
    ".jsonl": FileKind.JSONL,
    ".jsonl.gz": FileKind.JSONL_GZIP,
    ".jsonl.zst": FileKind.JSONL_ZSTD,
    ".parquet": FileKind.PARQUET,
}
SUPPORTED_SUFFIXES = ", ".join(SUFFIX_KINDS)


@dataclass(frozen=True, slots=True)
class UnreadableRow:
    """A row that could not even be decoded (e.g. a broken JSON line)."""

    reason: str


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One row of the source: its number, its decoded value (any JSON value) or why not, its file."""

    row: int
    value: object  # the decoded row, or an UnreadableRow
    file: str = ""  # the file inside a folder, S3 prefix or HF dataset; empty for a one-file DATA


@dataclass(frozen=True, slots=True)
class ColumnSelection:
    """Which columns to read from columnar files (Parquet, Arrow), and which make a file usable."""

    wanted: Sequence[str]  # read these when present, skip every other column
    need_one_of: Sequence[str]  # a file with none of these is unusable: SourceError


def open_rows(
    data: str,
    *,
    columns: ColumnSelection | None = None,
    s3_client_factory: S3ClientFactory = default_s3_client,
) -> Generator[SourceRow, None, None]:
    """Resolve DATA now (raising SourceError if it cannot be read at all), then stream its rows."""
    if not data.strip():
        raise SourceError("DATA is empty: pass a file, a folder or an s3:// URL")
    if data.startswith(S3_SCHEME):
        store: InputFiles = S3InputFiles.from_url(data, s3_client_factory())
    else:
        store = LocalInputFiles(Path(data))
    files = _data_files(store, data)
    readers = [_open_reader(store, data_file, columns) for data_file in files]
    return _rows_of(readers)


# --- what to read -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _DataFile:
    name: str  # the store's name for it (a path or an S3 key)
    kind: FileKind
    label: str  # shown as SourceRow.file


def _data_files(store: InputFiles, data: str) -> list[_DataFile]:
    if store.is_file(data):
        return [_DataFile(name=data, kind=_kind_of(data, store), label="")]
    relative = store.list_under(data)
    if HF_DATASET_DICT_FILE in relative.values():
        raise SourceError(f"{data} is a DatasetDict folder: pass one split's folder, e.g. {data}/train")
    if HF_STATE_FILE in relative.values():
        return _hugging_face_shards(store, data)
    files = [
        _DataFile(name=name, kind=_kind_of(name, store), label=relative[name])
        for name in sorted(relative, key=relative.__getitem__)
        if not _is_side_file(relative[name])
    ]
    if not files:
        raise SourceError(f"{data}: no {SUPPORTED_SUFFIXES} files in it")
    return files


def _is_side_file(relative_name: str) -> bool:
    parts = relative_name.split("/")
    if any(part.startswith(SKIPPED_NAME_PREFIXES) for part in parts):
        return True
    name = parts[-1].lower()
    return name in SIDE_FILE_NAMES or name.endswith(SIDE_FILE_SUFFIXES)


def _kind_of(name: str, store: InputFiles) -> FileKind:
    lowered = name.lower()
    for suffix, kind in SUFFIX_KINDS.items():
        if lowered.endswith(suffix):
            return kind
    raise SourceError(
        f"{name}: unknown file type; expected {SUPPORTED_SUFFIXES}, a folder of them, "
        "or a Hugging Face save_to_disk folder (a .json file of one object per line: rename it .jsonl)"
    )


def _hugging_face_shards(store: InputFiles, folder: str) -> list[_DataFile]:
    state_name = _join(folder, HF_STATE_FILE)
    try:
        state = json.loads(store.read_text(state_name))
        shard_names = [entry["filename"] for entry in state["_data_files"]]
    except (ValueError, KeyError, TypeError) as error:
        raise SourceError(f"{state_name}: not a datasets state file ({error!r})") from error
    if not shard_names:
        raise SourceError(f"{state_name}: lists no data files")
    escaping = [name for name in shard_names if not isinstance(name, str) or not stays_inside(name)]
    if escaping:
        raise SourceError(
            f"{state_name}: data file {escaping[0]!r} is not a plain name inside {folder}: refused"
        )
    shards = []
    for shard_name in shard_names:
        name = _join(folder, shard_name)
        if not store.is_file(name):
            raise SourceError(f"{name}: listed in {HF_STATE_FILE} but missing")
        shards.append(_DataFile(name=name, kind=FileKind.ARROW_STREAM, label=shard_name))
    return shards


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}"


# --- reading ------------------------------------------------------------------------------

_ReadErrors = (OSError, EOFError, zstd.ZstdError, pa.ArrowException, BotoCoreError)


@dataclass(frozen=True, slots=True)
class _Reader:
    name: str  # a path or s3:// URL, for messages
    rows: Callable[[], Iterator[SourceRow]]


def _open_reader(store: InputFiles, data_file: _DataFile, columns: ColumnSelection | None) -> _Reader:
    name, label = data_file.name, data_file.label
    if data_file.kind is FileKind.PARQUET:
        names = _columns_to_read(_parquet_schema(store, name), columns, name)
        return _Reader(name, lambda: _parquet_rows(store.open(name), names, label))
    if data_file.kind is FileKind.ARROW_STREAM:
        names = _columns_to_read(_arrow_stream_schema(store, name), columns, name)
        return _Reader(name, lambda: _arrow_stream_rows(store.open(name), names, label))
    return _Reader(name, lambda: _jsonl_rows(store.open(name), data_file.kind, label))


def _rows_of(readers: list[_Reader]) -> Generator[SourceRow, None, None]:
    for reader in readers:
        last_row = 0
        try:
            for source_row in reader.rows():
                last_row = source_row.row
                yield source_row
        except _ReadErrors as error:
            raise SourceError(f"{reader.name}: unreadable after row {last_row}: {error}") from error


def _decompressed(raw: io.BufferedIOBase, kind: FileKind) -> io.BufferedIOBase:
    """The decompressing view of raw; closing it leaves raw open (the caller closes raw)."""
    if kind is FileKind.JSONL_GZIP:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind is FileKind.JSONL_ZSTD:
        return zstd.ZstdFile(raw, mode="rb")
    return raw


def _jsonl_rows(raw: io.BufferedIOBase, kind: FileKind, label: str) -> Iterator[SourceRow]:
    with raw, _decompressed(raw, kind) as stream:
        for line_number, line in enumerate(stream, start=1):
            text = (line.removeprefix(UTF8_BOM) if line_number == 1 else line).rstrip(b"\r\n")
            if not text.strip():
                continue
            try:
                value: object = msgspec.json.decode(text)
            except msgspec.DecodeError as error:
                value = UnreadableRow(reason=f"invalid JSON: {error}")
            yield SourceRow(row=line_number, value=value, file=label)


def _parquet_schema(store: InputFiles, name: str) -> pa.Schema:
    try:
        with store.open(name) as stream:
            return pq.ParquetFile(stream).schema_arrow
    except _ReadErrors as error:
        raise SourceError(f"{name}: not a readable Parquet file: {error}") from error


def _parquet_rows(stream: io.BufferedIOBase, columns: list[str], label: str) -> Iterator[SourceRow]:
    with stream, pq.ParquetFile(stream, pre_buffer=False) as parquet:
        batches = parquet.iter_batches(batch_size=ROWS_PER_BATCH, columns=columns, use_threads=False)
        yield from _batch_rows(batches, label)


def _arrow_stream_schema(store: InputFiles, name: str) -> pa.Schema:
    try:
        with store.open(name) as stream, pa.ipc.open_stream(stream) as reader:
            return reader.schema
    except _ReadErrors as error:
        raise SourceError(f"{name}: not a readable Arrow stream file: {error}") from error


def _arrow_stream_rows(stream: io.BufferedIOBase, columns: list[str], label: str) -> Iterator[SourceRow]:
    with stream, pa.ipc.open_stream(stream) as reader:
        yield from _batch_rows((batch.select(columns) for batch in reader), label)


def _batch_rows(batches: Iterator[pa.RecordBatch], label: str) -> Iterator[SourceRow]:
    row = 0
    for batch in batches:
        for value in batch.to_pylist():
            row += 1
            yield SourceRow(row=row, value=value, file=label)


def _columns_to_read(schema: pa.Schema, columns: ColumnSelection | None, file_name: str) -> list[str]:
    present: list[str] = list(schema.names)
    if columns is None:
        return present
    if not any(column in present for column in columns.need_one_of):
        raise SourceError(
            f"{file_name}: has none of the columns {', '.join(columns.need_one_of)} "
            f"(its columns: {', '.join(present) or 'none'})"
        )
    return [column for column in columns.wanted if column in present]
