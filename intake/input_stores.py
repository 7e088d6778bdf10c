"""Where the files of a DATA argument are: the local file system or one S3 bucket.

An S3 object is streamed, never downloaded whole; a dropped connection resumes at the same byte,
pinned to the object's ETag. `intake/input_files.py` finds the data files and reads their rows.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from core.backoff import backoff_delay_s
from core.s3 import S3_MAX_ATTEMPTS, S3_SCHEME, S3Url, parse_s3_url, s3_client
from intake.errors import SourceError, SourceUnavailable

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

READ_BUFFER_BYTES = 1024 * 1024
# botocore retries every request (core.s3), not a response body cut off while it streams: a body
# read that fails resumes with a Range request from the byte it reached, as many times as botocore tries.
BODY_RESUME_BASE_DELAY_S = 0.5


class InputFiles(Protocol):
    """Where the files are: the local file system or one S3 bucket."""

    def is_file(self, name: str) -> bool: ...
    def list_under(self, folder: str) -> dict[str, str]: ...  # every file below: name -> relative path
    def read_text(self, name: str, max_bytes: int) -> str: ...  # SourceError when longer
    def open(self, name: str) -> io.BufferedIOBase: ...


class S3Client(Protocol):
    """The part of a boto3 S3 client used here."""

    def head_object(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def get_object(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def list_objects_v2(self, **kwargs: Any) -> Mapping[str, Any]: ...


S3ClientFactory = Callable[[], S3Client]


def default_s3_client() -> S3Client:
    client: S3Client = s3_client()
    return client


class LocalInputFiles:
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

    def read_text(self, name: str, max_bytes: int) -> str:
        return _bounded_text(self.open(name), name, max_bytes)

    def open(self, name: str) -> io.BufferedIOBase:
        return io.BufferedReader(io.FileIO(name), buffer_size=READ_BUFFER_BYTES)


class S3InputFiles:
    def __init__(self, client: S3Client, bucket: str) -> None:
        self._client = client
        self._bucket = bucket
        self._heads: dict[str, Mapping[str, Any]] = {}  # key -> HEAD response; pins size and ETag

    @staticmethod
    def check_url(url: str) -> S3Url:
        """The bucket and key an s3:// URL names, or SourceError."""
        location = parse_s3_url(url)
        if location is None:
            raise SourceError(f"{url}: no bucket name")
        return location

    @classmethod
    def from_url(cls, url: str, client: S3Client) -> S3InputFiles:
        location = cls.check_url(url)
        key = location.key
        store = cls(client, location.bucket)
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
            raise SourceUnavailable(f"{folder}: cannot list: {error}") from error
        if not keys:
            raise SourceError(f"{folder}: no such S3 object or prefix")
        return {self._url(key): key.removeprefix(prefix).lstrip("/") for key in keys}

    def read_text(self, name: str, max_bytes: int) -> str:
        return _bounded_text(self.open(name), name, max_bytes)

    def open(self, name: str) -> io.BufferedIOBase:
        key = self._key(name)
        head = self._head(key)
        if head is None:
            raise SourceError(f"{name}: no such S3 object")
        raw = S3ObjectReader(self._client, self._bucket, key, size=head["ContentLength"], etag=head["ETag"])
        return io.BufferedReader(raw, buffer_size=READ_BUFFER_BYTES)

    def _head(self, key: str) -> Mapping[str, Any] | None:
        if key not in self._heads:
            try:
                self._heads[key] = self._client.head_object(Bucket=self._bucket, Key=key)
            except ClientError as error:
                if _error_code(error) in {"404", "NoSuchKey"}:
                    return None
                raise SourceUnavailable(f"{self._url(key)}: {error}") from error
            except BotoCoreError as error:
                raise SourceUnavailable(f"{self._url(key)}: {error}") from error
        return self._heads[key]

    def _key(self, name: str) -> str:
        location = parse_s3_url(name)
        return location.key if location is not None else ""

    def _url(self, key: str) -> str:
        return f"{S3_SCHEME}{self._bucket}/{key}"


def _bounded_text(stream: io.BufferedIOBase, name: str, max_bytes: int) -> str:
    with stream:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SourceError(f"{name}: longer than {max_bytes:,} bytes, too long for what it should be: refused")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SourceError(f"{name}: not UTF-8 text ({error})") from error


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3ObjectReader(io.RawIOBase):
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
        for attempt in range(1, S3_MAX_ATTEMPTS + 1):
            if self._body is None:
                self._body = self._open_at_position()  # a request: botocore's retries, not these
            try:
                chunk: bytes = self._body.read(wanted)
                if chunk:
                    return chunk
                raise ConnectionError("the response ended before the object did")
            except (BotoCoreError, OSError) as error:
                self._drop_body()
                if attempt == S3_MAX_ATTEMPTS:
                    raise SourceUnavailable(
                        f"{self._url()}: read failed at byte {self._position} "
                        f"after {attempt} attempts: {error}"
                    ) from error
                time.sleep(backoff_delay_s(attempt, base_s=BODY_RESUME_BASE_DELAY_S))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _open_at_position(self) -> Any:
        try:
            response = self._client.get_object(
                Bucket=self._bucket, Key=self._key, Range=f"bytes={self._position}-", IfMatch=self._etag
            )
        except ClientError as error:
            if _error_code(error) in {"412", "PreconditionFailed"}:
                raise SourceError(f"{self._url()}: changed while being read") from error
            raise SourceUnavailable(f"{self._url()}: {error}") from error
        except BotoCoreError as error:
            raise SourceUnavailable(
                f"{self._url()}: read failed at byte {self._position}: {error}"
            ) from error
        return response["Body"]

    def _url(self) -> str:
        return f"{S3_SCHEME}{self._bucket}/{self._key}"

    def _drop_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None
