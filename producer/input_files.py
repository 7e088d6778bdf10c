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
  for a folder. The client comes from `s3_client_factory`, by default `boto3.client("s3")`, so the
  standard AWS chain applies (credentials, region, AWS_ENDPOINT_URL). An object is streamed, never
  downloaded whole; a dropped connection resumes at the same byte, pinned to the object's ETag.

Row numbers: the physical line number in a JSONL file (blank lines are skipped, not renumbered,
so an editor opens the file at the right line), the 1-based row index in a Parquet or Arrow file.
A row that cannot be decoded is yielded as an `UnreadableRow`; only a source that cannot be read at
all raises `SourceError`. Opening is eager (a missing file fails at the call, not at the first
row); reading is lazy. A file that breaks part-way (a truncated .gz, a corrupt Parquet page) raises
`SourceError` naming the last row read: the rows before it were good and stay yielded.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import boto3
import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from botocore.exceptions import BotoCoreError, ClientError

from inference.safe_paths import stays_inside
from producer.errors import SourceError

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

S3_SCHEME = "s3://"
ROWS_PER_BATCH = 1024  # rows decoded to Python at a time from Parquet/Arrow
READ_BUFFER_BYTES = 1024 * 1024
UTF8_BOM = b"\xef\xbb\xbf"
S3_READ_ATTEMPTS = 5  # per read call: a dropped connection resumes with a Range request
S3_RETRY_BASE_DELAY_S = 0.5  # doubled after each failed attempt
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


class S3Client(Protocol):
    """The part of a boto3 S3 client used here."""

    def head_object(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def get_object(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def list_objects_v2(self, **kwargs: Any) -> Mapping[str, Any]: ...


S3ClientFactory = Callable[[], S3Client]


def default_s3_client() -> S3Client:
    client: S3Client = boto3.client("s3")
    return client


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
        store: _InputFiles = _S3InputFiles.from_url(data, s3_client_factory())
    else:
        store = _LocalInputFiles(Path(data))
    files = _data_files(store, data)
    readers = [_open_reader(store, data_file, columns) for data_file in files]
    return _rows_of(readers)


# --- what to read -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _DataFile:
    name: str  # the store's name for it (a path or an S3 key)
    kind: FileKind
    label: str  # shown as SourceRow.file


class _InputFiles(Protocol):
    """Where the files are: the local file system or one S3 bucket."""

    def is_file(self, name: str) -> bool: ...
    def list_under(self, folder: str) -> dict[str, str]: ...  # every file below: name -> relative path
    def read_text(self, name: str) -> str: ...
    def open(self, name: str) -> io.BufferedIOBase: ...


def _data_files(store: _InputFiles, data: str) -> list[_DataFile]:
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


def _kind_of(name: str, store: _InputFiles) -> FileKind:
    lowered = name.lower()
    for suffix, kind in SUFFIX_KINDS.items():
        if lowered.endswith(suffix):
            return kind
    raise SourceError(
        f"{name}: unknown file type; expected {SUPPORTED_SUFFIXES}, a folder of them, "
        "or a Hugging Face save_to_disk folder (a .json file of one object per line: rename it .jsonl)"
    )


def _hugging_face_shards(store: _InputFiles, folder: str) -> list[_DataFile]:
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


def _open_reader(store: _InputFiles, data_file: _DataFile, columns: ColumnSelection | None) -> _Reader:
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


def _parquet_schema(store: _InputFiles, name: str) -> pa.Schema:
    try:
        with store.open(name) as stream:
            return pq.ParquetFile(stream).schema_arrow
    except _ReadErrors as error:
        raise SourceError(f"{name}: not a readable Parquet file: {error}") from error


def _parquet_rows(stream: io.BufferedIOBase, columns: list[str], label: str) -> Iterator[SourceRow]:
    with stream, pq.ParquetFile(stream, pre_buffer=False) as parquet:
        batches = parquet.iter_batches(batch_size=ROWS_PER_BATCH, columns=columns, use_threads=False)
        yield from _batch_rows(batches, label)


def _arrow_stream_schema(store: _InputFiles, name: str) -> pa.Schema:
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


# --- stores -------------------------------------------------------------------------------


class _LocalInputFiles:
    def __init__(self, data: Path) -> None:
        if not data.exists():
            raise SourceError(f"{data}: no such file or folder")

    def is_file(self, name: str) -> bool:
        """A regular file, or a named pipe read as one (`mkfifo p.jsonl; zcat big.jsonl.gz > p.jsonl &`)."""
        path = Path(name)
        return path.is_file() or path.is_fifo()

    def list_under(self, folder: str) -> dict[str, str]:
        root = Path(folder)
        return {str(path): path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}

    def read_text(self, name: str) -> str:
        return Path(name).read_text(encoding="utf-8")

    def open(self, name: str) -> io.BufferedIOBase:
        return io.BufferedReader(io.FileIO(name), buffer_size=READ_BUFFER_BYTES)


class _S3InputFiles:
    def __init__(self, client: S3Client, bucket: str) -> None:
        self._client = client
        self._bucket = bucket
        self._heads: dict[str, Mapping[str, Any]] = {}  # key -> HEAD response; pins size and ETag

    @classmethod
    def from_url(cls, url: str, client: S3Client) -> _S3InputFiles:
        bucket, _, key = url.removeprefix(S3_SCHEME).partition("/")
        if not bucket:
            raise SourceError(f"{url}: no bucket name")
        store = cls(client, bucket)
        if key and not key.endswith("/") and not store.is_file(url):
            raise SourceError(f"{url}: no such S3 object (a folder needs a trailing slash)")
        return store

    def is_file(self, name: str) -> bool:
        key = self._key(name)
        if not key or key.endswith("/"):
            return False
        return self._head(key) is not None

    def list_under(self, folder: str) -> dict[str, str]:
        prefix = self._key(folder)
        keys: list[str] = []
        request: dict[str, str] = {"Bucket": self._bucket, "Prefix": prefix}
        try:
            while True:
                page = self._client.list_objects_v2(**request)
                keys.extend(item["Key"] for item in page.get("Contents", []) if not item["Key"].endswith("/"))
                if not page.get("IsTruncated"):
                    break
                request["ContinuationToken"] = page["NextContinuationToken"]
        except (ClientError, BotoCoreError) as error:
            raise SourceError(f"{folder}: cannot list: {error}") from error
        if not keys:
            raise SourceError(f"{folder}: no such S3 object or prefix")
        return {self._url(key): key.removeprefix(prefix).lstrip("/") for key in keys}

    def read_text(self, name: str) -> str:
        with self.open(name) as stream:
            return stream.read().decode("utf-8")

    def open(self, name: str) -> io.BufferedIOBase:
        key = self._key(name)
        head = self._head(key)
        if head is None:
            raise SourceError(f"{name}: no such S3 object")
        raw = _S3ObjectReader(self._client, self._bucket, key, size=head["ContentLength"], etag=head["ETag"])
        return io.BufferedReader(raw, buffer_size=READ_BUFFER_BYTES)

    def _head(self, key: str) -> Mapping[str, Any] | None:
        if key not in self._heads:
            try:
                self._heads[key] = self._client.head_object(Bucket=self._bucket, Key=key)
            except ClientError as error:
                if _error_code(error) in {"404", "NoSuchKey"}:
                    return None
                raise SourceError(f"{self._url(key)}: {error}") from error
            except BotoCoreError as error:
                raise SourceError(f"{self._url(key)}: {error}") from error
        return self._heads[key]

    def _key(self, name: str) -> str:
        return name.removeprefix(S3_SCHEME).partition("/")[2]

    def _url(self, key: str) -> str:
        return f"{S3_SCHEME}{self._bucket}/{key}"


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class _S3ObjectReader(io.RawIOBase):
    """One S3 object as a seekable raw stream, fetched with Range requests pinned to its ETag.

    Reading from where the last request stopped reuses its open response; a dropped connection
    or a seek opens a new one at the current byte. Pinning the ETag (IfMatch) means a resumed
    read can never splice two versions of an object that was overwritten meanwhile.
    """

    def __init__(self, client: S3Client, bucket: str, key: str, *, size: int, etag: str) -> None:
        super().__init__()
        self._client = client
        self._bucket = bucket
        self._key = key
        self._size = size
        self._etag = etag
        self._position = 0
        self._body: Any = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        origins = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}
        position = origins[whence] + offset
        if position != self._position:
            self._drop_body()
            self._position = position
        return self._position

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), self._size - self._position)
        if wanted <= 0:
            return 0
        chunk = self._read_with_resume(wanted)
        view[: len(chunk)] = chunk
        self._position += len(chunk)
        return len(chunk)

    def close(self) -> None:
        self._drop_body()
        super().close()

    def _read_with_resume(self, wanted: int) -> bytes:
        for attempt in range(1, S3_READ_ATTEMPTS + 1):
            try:
                if self._body is None:
                    self._body = self._open_at_position()
                chunk: bytes = self._body.read(wanted)
                if chunk:
                    return chunk
                raise ConnectionError("the response ended before the object did")
            except (BotoCoreError, OSError) as error:
                self._drop_body()
                if attempt == S3_READ_ATTEMPTS:
                    raise SourceError(
                        f"{self._url()}: read failed at byte {self._position} "
                        f"after {attempt} attempts: {error}"
                    ) from error
                time.sleep(S3_RETRY_BASE_DELAY_S * 2 ** (attempt - 1))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _open_at_position(self) -> Any:
        try:
            response = self._client.get_object(
                Bucket=self._bucket, Key=self._key, Range=f"bytes={self._position}-", IfMatch=self._etag
            )
        except ClientError as error:
            if _error_code(error) in {"412", "PreconditionFailed"}:
                raise SourceError(f"{self._url()}: changed while being read") from error
            raise SourceError(f"{self._url()}: {error}") from error
        return response["Body"]

    def _url(self) -> str:
        return f"{S3_SCHEME}{self._bucket}/{self._key}"

    def _drop_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None
