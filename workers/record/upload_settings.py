"""When the uploader flushes a run's staged completions into a part, and how long it holds the flush lock.

Its own module so that the worker settings compose it without importing the uploader's codecs.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_UPLOAD_MAX_COMPLETIONS = 1000
DEFAULT_UPLOAD_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_UPLOAD_MAX_AGE_S = 60.0
# Lease of a run's flush lock, renewed before each part. An uploader killed mid-flush holds it until it
# expires, so it is short: one part (at most 64 MB to S3) takes seconds.
DEFAULT_UPLOAD_LOCK_S = 60.0


@dataclass(frozen=True)
class UploadSettings:
    max_completions: int = DEFAULT_UPLOAD_MAX_COMPLETIONS
    max_bytes: int = DEFAULT_UPLOAD_MAX_BYTES
    max_age_s: float = DEFAULT_UPLOAD_MAX_AGE_S
    lock_s: float = DEFAULT_UPLOAD_LOCK_S
