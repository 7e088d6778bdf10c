"""Where a model folder is staged from: a local (or network-mounted) folder, or an S3 prefix.

S3 goes through `core.s3`'s client (the standard credential chain and retry policy; boto3 itself
honours AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_S3 for S3-compatible stores).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from core.s3 import S3_SCHEME, is_s3_url, parse_s3_url, s3_client
from node.errors import StagingError

COPY_CHUNK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    relpath: str
    """Relative to the model folder, with `/` separators."""
    size_bytes: int


class ModelSource(Protocol):
    @property
    def name(self) -> str:
        """The model folder's own name, used for the default destination."""
        ...

    def list_files(self) -> list[SourceFile]: ...

    def fetch(self, file: SourceFile, target: Path, advance: Callable[[int], object]) -> None:
        """Write `file` to `target`, calling `advance(n)` as bytes arrive (possibly from other threads)."""
        ...


@dataclass(frozen=True)
class LocalSource:
    root: Path

    @property
    def name(self) -> str:
        return self.root.resolve().name

    def __str__(self) -> str:
        return str(self.root)

    def list_files(self) -> list[SourceFile]:
        if not self.root.is_dir():
            raise StagingError(f"source folder {self.root} does not exist or is not a folder")
        files = []
        for folder, _dirs, names in os.walk(self.root):
            for filename in names:
                path = Path(folder) / filename
                # stat() follows symlinks, so a Hugging Face cache snapshot (links to blobs) works.
                files.append(SourceFile(path.relative_to(self.root).as_posix(), path.stat().st_size))
        return sorted(files, key=lambda f: f.relpath)

    def fetch(self, file: SourceFile, target: Path, advance: Callable[[int], object]) -> None:
        with (self.root / file.relpath).open("rb") as reader, target.open("wb") as writer:
            while chunk := reader.read(COPY_CHUNK_BYTES):
                writer.write(chunk)
                advance(len(chunk))


class S3Source:
    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client

    @classmethod
    def from_url(cls, url: str, client: Any | None = None) -> S3Source:
        location = parse_s3_url(url)
        if location is None:
            raise StagingError(f"{url!r} names no bucket; expected s3://bucket/prefix")
        return cls(location.bucket, location.key, client if client is not None else s3_client())

    @property
    def name(self) -> str:
        return PurePosixPath(self.prefix).name or self.bucket

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}"

    def list_files(self) -> list[SourceFile]:
        from botocore.exceptions import BotoCoreError, ClientError

        # The trailing slash keeps s3://b/Qwen3 from also listing s3://b/Qwen3-base/.
        key_prefix = f"{self.prefix}/" if self.prefix else ""
        files = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=key_prefix
            ):
                for item in page.get("Contents", []):
                    key: str = item["Key"]
                    if not key.endswith("/"):
                        files.append(SourceFile(key[len(key_prefix) :], int(item["Size"])))
        except (BotoCoreError, ClientError) as error:
            raise StagingError(f"cannot list {self}: {error}") from error
        if not files:
            raise StagingError(f"no objects under {self}/")
        return sorted(files, key=lambda f: f.relpath)

    def fetch(self, file: SourceFile, target: Path, advance: Callable[[int], object]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        key = f"{self.prefix}/{file.relpath}" if self.prefix else file.relpath
        try:
            self.client.download_file(self.bucket, key, str(target), Callback=advance)
        except (BotoCoreError, ClientError) as error:
            raise StagingError(f"cannot download {S3_SCHEME}{self.bucket}/{key}: {error}") from error


def open_source(spec: str, s3_client: Any | None = None) -> ModelSource:
    """`s3://bucket/prefix` or a local folder path."""
    if is_s3_url(spec):
        return S3Source.from_url(spec, s3_client)
    return LocalSource(Path(spec))
