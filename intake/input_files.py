"""Open a DATA argument and stream its rows, one decoded row at a time, with flat memory.

DATA names its files as intake/data_files.py says (JSONL, Parquet, folders of them, a `datasets` folder,
any of them on S3). An S3 client comes from `s3_client_factory`, by default `core.s3.s3_client()`, so
the standard AWS chain applies (credentials, region, AWS_ENDPOINT_URL). An object is streamed, never
downloaded whole; a dropped connection resumes at the same byte, pinned to the object's ETag. Every read is
bounded (intake/limits.py): a JSONL line by the row limit, a Parquet or Arrow batch by a byte budget.

Row numbers: the physical line number in a JSONL file (blank lines are skipped, not renumbered,
so an editor opens the file at the right line), the 1-based row index in a Parquet or Arrow file.
A row that cannot be decoded is yielded as an `UnreadableRow`; only a source that cannot be read at
all raises `SourceError`. Opening is eager (a missing file fails at the call, not at the first
row); reading is lazy. A file that breaks part-way (a truncated .gz, a corrupt Parquet page) raises
`SourceError` naming the last row read: the rows before it were good and stay yielded.

Where the files are (a folder, an S3 bucket) is `intake/input_stores.py`, which of them are data
`intake/data_files.py`; this module reads their rows.
"""

from __future__ import annotations

import gzip
import io
import sys
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from botocore.exceptions import BotoCoreError

from core.s3 import S3_SCHEME
from intake.data_files import DataFile, FileKind, data_files
from intake.errors import SourceError
from intake.input_stores import (
    InputFiles,
    LocalInputFiles,
    S3ClientFactory,
    S3InputFiles,
    default_s3_client,
)
from intake.limits import DEFAULT_READ_LIMITS, OVERLONG_LINE_SKIP_FACTOR, ReadLimits
from intake.parquet_pages import UnreadablePageHeader, uncompressed_page_bytes
from intake.row_sizes import row_sizes_bytes

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

ROWS_PER_BATCH = 1024  # rows read at a time from Parquet/Arrow (then turned into Python by byte budget)
PARQUET_READ_BUFFER_BYTES = 1024 * 1024  # a column chunk is streamed in pieces, not read whole
UTF8_BOM = b"\xef\xbb\xbf"


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

    wanted: Sequence[str] | None  # read these when present, skip every other column; None: read all
    need_one_of: Sequence[str]  # a file with none of these is unusable: SourceError


def open_rows(
    data: str,
    *,
    columns: ColumnSelection | None = None,
    s3_client_factory: S3ClientFactory = default_s3_client,
    limits: ReadLimits = DEFAULT_READ_LIMITS,
) -> Generator[SourceRow, None, None]:
    """Resolve DATA now (raising SourceError if it cannot be read at all), then stream its rows, none
    longer than `limits` allows (intake/limits.py)."""
    if not data.strip():
        raise SourceError("DATA is empty: pass a file, a folder or an s3:// URL")
    if data.startswith(S3_SCHEME):
        store: InputFiles = S3InputFiles.from_url(data, s3_client_factory())
    else:
        store = LocalInputFiles(Path(data))
    files = data_files(store, data)
    readers = [_open_reader(store, data_file, columns, limits) for data_file in files]
    return _rows_of(readers)


# --- reading ------------------------------------------------------------------------------

_ReadErrors = (OSError, EOFError, zstd.ZstdError, pa.ArrowException, BotoCoreError)


@dataclass(frozen=True, slots=True)
class _Reader:
    name: str  # a path or s3:// URL, for messages
    rows: Callable[[], Iterator[SourceRow]]


def _open_reader(
    store: InputFiles, data_file: DataFile, columns: ColumnSelection | None, limits: ReadLimits
) -> _Reader:
    name, label = data_file.name, data_file.label
    if data_file.kind is FileKind.PARQUET:
        metadata = _parquet_metadata(store, name)
        names = _columns_to_read(metadata.schema.to_arrow_schema(), columns, name)
        stored_bytes = _check_row_groups(metadata, names, name, limits)
        return _Reader(name, lambda: _parquet_rows(store.open(name), names, label, limits, stored_bytes))
    if data_file.kind is FileKind.ARROW_STREAM:
        names = _columns_to_read(_arrow_stream_schema(store, name), columns, name)
        return _Reader(name, lambda: _arrow_stream_rows(store.open(name), names, label, limits))
    return _Reader(name, lambda: _jsonl_rows(store.open(name), data_file.kind, label, limits))


def _rows_of(readers: list[_Reader]) -> Generator[SourceRow, None, None]:
    for reader in readers:
        last_row = 0
        try:
            for source_row in reader.rows():
                last_row = source_row.row
                yield source_row
        except _ReadErrors as error:
            raise SourceError(f"{reader.name}: unreadable after row {last_row}: {error}") from error
        except SourceError as error:  # a bound the file broke, part-way
            after = f"after row {last_row}: " if last_row else ""
            raise SourceError(f"{reader.name}: {after}{error}") from error


def _decompressed(raw: io.BufferedIOBase, kind: FileKind) -> io.BufferedIOBase:
    """The decompressing view of raw; closing it leaves raw open (the caller closes raw)."""
    if kind is FileKind.JSONL_GZIP:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind is FileKind.JSONL_ZSTD:
        return zstd.ZstdFile(raw, mode="rb")
    return raw


def _jsonl_rows(
    raw: io.BufferedIOBase, kind: FileKind, label: str, limits: ReadLimits
) -> Iterator[SourceRow]:
    stored_bytes = _never_inflated if kind is FileKind.JSONL else raw.tell  # a FIFO has no tell()
    with raw, _decompressed(raw, kind) as stream:
        lines = _bounded_lines(stream, limits, stored_bytes=stored_bytes)
        for line_number, line in enumerate(lines, start=1):
            if isinstance(line, UnreadableRow):
                yield SourceRow(row=line_number, value=line, file=label)
                continue
            text = (line.removeprefix(UTF8_BOM) if line_number == 1 else line).rstrip(b"\r\n")
            if not text.strip():
                continue
            yield SourceRow(row=line_number, value=_decoded(text), file=label)


def _decoded(text: bytes) -> object:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as error:
        return UnreadableRow(reason=f"invalid JSON: {error}")
    except RecursionError:
        return UnreadableRow(reason="invalid row: nested deeper than the JSON decoder goes")


def _never_inflated() -> int:
    """The stored size of a plain file, for the expansion check: its rows are its bytes."""
    return sys.maxsize


def _bounded_lines(
    stream: io.BufferedIOBase, limits: ReadLimits, *, stored_bytes: Callable[[], int]
) -> Iterator[bytes | UnreadableRow]:
    """Each line, never holding more than the row limit: a longer line is read through in pieces and
    yields its rejection. A line with no end in sight, or a compressed file inflating far beyond any
    text's ratio, refuses the file (SourceError)."""
    limit = limits.max_row_bytes
    line_number, read_bytes = 0, 0
    while line := stream.readline(limit + 1):
        line_number += 1
        read_bytes += len(line)
        limits.check_expansion(read_bytes, stored_bytes)
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n") and (line := stream.readline(limit)):
            size += len(line)
            read_bytes += len(line)
            limits.check_expansion(read_bytes, stored_bytes)
            if size > limits.overlong_line_skip_bytes:
                raise SourceError(
                    f"line {line_number} runs on past {size:,} bytes without a line end, over "
                    f"{OVERLONG_LINE_SKIP_FACTOR} times the row limit of {limit:,}: not a file of JSON "
                    "lines: refused"
                )
        yield UnreadableRow(reason=limits.over_limit(size - len(line) + len(line.rstrip(b"\r\n"))))


def _parquet_metadata(store: InputFiles, name: str) -> pq.FileMetaData:
    try:
        with store.open(name) as stream:
            return pq.ParquetFile(stream).metadata
    except _ReadErrors as error:
        raise SourceError(f"{name}: not a readable Parquet file: {error}") from error


def _check_row_groups(metadata: pq.FileMetaData, columns: list[str], name: str, limits: ReadLimits) -> int:
    """Refuse a row group whose rows hold more than the row limit on average: some of them are over it, and
    a cell cannot be sized before it is read whole (a few KB of zstd can hold a gigabyte-long cell). The
    bytes these columns take in the file."""
    first_row, stored_bytes = 1, 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        chunks = [group.column(column) for column in range(group.num_columns)]
        read = [chunk for chunk in chunks if chunk.path_in_schema.split(".")[0] in columns]
        size = sum(chunk.total_uncompressed_size for chunk in read)
        stored_bytes += sum(chunk.total_compressed_size for chunk in read)
        if size > max(group.num_rows, 1) * limits.max_row_bytes:
            rows = f"rows {first_row}-{first_row + group.num_rows - 1}"
            raise SourceError(
                f"{name}: row group {index} ({rows}) holds {size:,} bytes in {group.num_rows:,} rows, more "
                f"than the row limit of {limits.max_row_bytes:,} a row: refused (--max-row-bytes raises it)"
            )
        first_row += group.num_rows
    return stored_bytes


def _parquet_rows(
    stream: io.BufferedIOBase, columns: list[str], label: str, limits: ReadLimits, stored_bytes: int
) -> Iterator[SourceRow]:
    with stream, pq.ParquetFile(stream, pre_buffer=False, buffer_size=PARQUET_READ_BUFFER_BYTES) as parquet:
        yield from _batch_rows(
            _parquet_batches(parquet, stream, columns, limits), label, limits, lambda: stored_bytes
        )


def _parquet_batches(
    parquet: pq.ParquetFile, stream: io.BufferedIOBase, columns: list[str], limits: ReadLimits
) -> Iterator[pa.RecordBatch]:
    """Each row group's rows in batches sized for it (`_rows_per_batch`)."""
    for group in range(parquet.metadata.num_row_groups):
        batch_rows = _rows_per_batch(parquet.metadata.row_group(group), columns, stream, limits)
        yield from parquet.iter_batches(
            batch_size=batch_rows, row_groups=[group], columns=columns, use_threads=False
        )


def _rows_per_batch(
    group: pq.RowGroupMetaData, columns: list[str], stream: io.BufferedIOBase, limits: ReadLimits
) -> int:
    """As many rows as fit the batch budget even if each repeats its dictionaries' longest possible value
    (a dictionary page's size bounds it), on as many items as the group's rows hold on average."""
    row_bytes = 0
    for chunk in (group.column(index) for index in range(group.num_columns)):
        if chunk.has_dictionary_page and chunk.path_in_schema.split(".")[0] in columns:
            position = stream.tell()
            try:
                page_bytes = uncompressed_page_bytes(stream, chunk.dictionary_page_offset)
            except UnreadablePageHeader:
                page_bytes = chunk.total_uncompressed_size
            finally:
                stream.seek(position)
            row_bytes += page_bytes * max(1, -(-chunk.num_values // max(group.num_rows, 1)))
    return max(1, min(ROWS_PER_BATCH, limits.batch_bytes // max(row_bytes, 1)))


def _arrow_stream_schema(store: InputFiles, name: str) -> pa.Schema:
    try:
        with store.open(name) as stream, pa.ipc.open_stream(stream) as reader:
            return reader.schema
    except _ReadErrors as error:
        raise SourceError(f"{name}: not a readable Arrow stream file: {error}") from error


def _arrow_stream_rows(
    stream: io.BufferedIOBase, columns: list[str], label: str, limits: ReadLimits
) -> Iterator[SourceRow]:
    with stream, pa.ipc.open_stream(stream) as reader:
        yield from _batch_rows((batch.select(columns) for batch in reader), label, limits, stream.tell)


def _batch_rows(
    batches: Iterator[pa.RecordBatch], label: str, limits: ReadLimits, stored_bytes: Callable[[], int]
) -> Iterator[SourceRow]:
    """Each batch's rows sized first: one over the limit is rejected without being turned into Python, the
    others become Python objects at most `limits.batch_bytes` at a time."""
    row, read_bytes = 0, 0
    for batch in batches:
        sizes = row_sizes_bytes(batch)
        read_bytes += sum(sizes)
        limits.check_expansion(read_bytes, stored_bytes)
        for start, end in _slices(sizes, limits):
            if sizes[start] > limits.max_row_bytes:
                values: list[object] = [UnreadableRow(reason=limits.over_limit(sizes[start]))]
            else:
                values = batch.slice(start, end - start).to_pylist()
            for value in values:
                row += 1
                yield SourceRow(row=row, value=value, file=label)


def _slices(sizes: list[int], limits: ReadLimits) -> Iterator[tuple[int, int]]:
    """Runs of consecutive rows within the row limit, each of at most batch_bytes (or one row); a row over
    the limit is a run of its own."""
    if sizes and max(sizes) <= limits.max_row_bytes and sum(sizes) <= limits.batch_bytes:
        yield 0, len(sizes)
        return
    start, taken_bytes = 0, 0
    for index, size in enumerate(sizes):
        over = size > limits.max_row_bytes
        if index > start and (over or taken_bytes + size > limits.batch_bytes):
            yield start, index
            start, taken_bytes = index, 0
        if over:
            yield index, index + 1
            start = index + 1
        else:
            taken_bytes += size
    if start < len(sizes):
        yield start, len(sizes)


def _columns_to_read(schema: pa.Schema, columns: ColumnSelection | None, file_name: str) -> list[str]:
    present: list[str] = list(schema.names)
    if columns is None:
        return present
    if not any(column in present for column in columns.need_one_of):
        raise SourceError(
            f"{file_name}: has none of the columns {', '.join(columns.need_one_of)} "
            f"(its columns: {', '.join(present) or 'none'})"
        )
    if columns.wanted is None:
        return present
    return [column for column in columns.wanted if column in present]
