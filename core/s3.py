"""The one way draftgen reaches S3: `s3://bucket/key` URLs read one way, and boto3 clients built with one
retry policy. Model staging, the producer's inputs and the output store all come through here.

boto3 honours `AWS_ENDPOINT_URL` and the standard credential chain by itself; it is imported only when
a client is built (a tenth of a second that a command touching no S3 should not pay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

S3_SCHEME = "s3://"
# botocore retries each request ("standard" mode: throttling, 5xx and dropped connections, with
# backoff): the one retry layer of an S3 call. What a caller retries above it is whole work (a flush).
S3_MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class S3Url:
    bucket: str
    key: str  # everything after the bucket's slash, literally (S3 keys may hold `?` and `#`); "" for none


def is_s3_url(url: str) -> bool:
    return url.startswith(S3_SCHEME)


def parse_s3_url(url: str) -> S3Url | None:
    """The bucket and key of an `s3://` URL; None when it is not one or names no bucket."""
    if not is_s3_url(url):
        return None
    bucket, _, key = url.removeprefix(S3_SCHEME).partition("/")
    return S3Url(bucket, key) if bucket else None


def s3_client() -> Any:
    """A boto3 S3 client with draftgen's retry policy."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"}))
