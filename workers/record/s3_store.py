"""An S3 bucket (or any S3 endpoint) as a run's output store; `record.storage` opens it for s3:// URLs.

Its own module because boto3 takes a tenth of a second to import, which a folder output and every
command that touches no S3 should not pay.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import boto3.exceptions
import botocore.exceptions

from core.s3 import s3_client
from core.safe_paths import stays_inside
from workers.errors import ObjectMissing, StoreUnavailable, UnsafeKey
from workers.record.object_store import ObjectInfo

STORE_RETRY_DELAY_S = 10.0
# botocore retries each request (core.s3's policy); a flush that still fails raises StoreUnavailable,
# and Celery's retry of the flush task is the layer above it: the whole part is written again later.
S3_PRECONDITION_FAILED = "PreconditionFailed"
S3_CONFLICT = "ConditionalRequestConflict"
S3_NOT_FOUND = ("NoSuchKey", "404", "NotFound")


def _error_code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3Store:
    def __init__(self, bucket: str, prefix: str, client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._s3 = client or s3_client()

    def _full(self, key: str) -> str:
        bare = key.rstrip("/")
        if bare and not stays_inside(bare):  # S3 keys are literal, but a reader's copy would not be
            raise UnsafeKey(f"object key {key!r} would name an object outside {self.url}: refused")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, operation: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._s3, operation)(Bucket=self.bucket, **kwargs)
        except botocore.exceptions.ClientError as error:
            if _error_code(error) in (S3_PRECONDITION_FAILED, *S3_NOT_FOUND):
                raise
            raise StoreUnavailable(
                f"S3 {operation} on {self.url} failed: {error}", delay_s=STORE_RETRY_DELAY_S
            ) from error
        except botocore.exceptions.BotoCoreError as error:
            raise StoreUnavailable(
                f"S3 {operation} on {self.url} failed: {error}", delay_s=STORE_RETRY_DELAY_S
            ) from error

    def put(self, key: str, data: bytes) -> None:
        self._call("put_object", Key=self._full(key), Body=data)

    def put_file(self, key: str, path: Path) -> None:
        """A large file, uploaded in parts by boto3's transfer manager; S3 shows it whole or not at all."""
        try:
            self._s3.upload_file(str(path), self.bucket, self._full(key))
        except (boto3.exceptions.S3UploadFailedError, botocore.exceptions.BotoCoreError) as error:
            raise StoreUnavailable(
                f"S3 upload of {key} to {self.url} failed: {error}", delay_s=STORE_RETRY_DELAY_S
            ) from error

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            self._call("put_object", Key=self._full(key), Body=data, IfNoneMatch="*")
        except botocore.exceptions.ClientError as error:
            if _error_code(error) in (S3_PRECONDITION_FAILED, S3_CONFLICT):
                return False
            raise
        return True

    def get(self, key: str) -> bytes:
        try:
            body: bytes = self._call("get_object", Key=self._full(key))["Body"].read()
        except botocore.exceptions.ClientError as error:
            raise ObjectMissing(key) from error
        return body

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        start = len(self.prefix) + 1 if self.prefix else 0
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", Prefix=self._full(prefix), **token)
            for item in page.get("Contents", []):
                yield ObjectInfo(item["Key"][start:], int(item["Size"]), item["LastModified"].timestamp())
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def delete(self, key: str) -> None:
        self._call("delete_object", Key=self._full(key))
