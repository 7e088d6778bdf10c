"""Compact blobs for Redis: msgspec JSON, zstd-compressed; and reading any record back with a ceiling.

Nothing read back from Redis is trusted: a blob is inflated only up to its ceiling (a frame that
declares more is refused before a byte is inflated, one that does not is cut off one byte past it, and
the decompressor's window is held to the ceiling too), and then decoded as its record type. Whatever
fails raises RecordUnreadable with a short reason; the ceilings are in workers/state/record_limits.py.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

import msgspec

from workers.errors import RecordUnreadable

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

T = TypeVar("T")
ZSTD_LEVEL = 3  # fast, and ~3x on English text
MIN_WINDOW_LOG, MAX_WINDOW_LOG = 10, 31  # what zstd allows a frame's window (64-bit builds)
UNREADABLE = "unreadable"  # not a whole zstd frame, or not the record it should be
OVER_LIMIT = "over_limit"  # inflates past what a real record can be

_encoder = msgspec.json.Encoder()


def encode_json(record: Any) -> bytes:
    return _encoder.encode(record)


def encode_blob(record: Any) -> bytes:
    return compress(encode_json(record))


def compress(data: bytes) -> bytes:
    return zstd.compress(data, level=ZSTD_LEVEL)


def decode_blob(blob: bytes, record_type: type[T], *, limit_bytes: int) -> T:
    """The record a blob holds, inflated to at most `limit_bytes` (RecordUnreadable otherwise)."""
    return decode_json(inflate(blob, limit_bytes=limit_bytes), record_type, limit_bytes=limit_bytes)


def decode_json(raw: bytes | str, record_type: type[T], *, limit_bytes: int) -> T:
    """A JSON record of at most `limit_bytes` (RecordUnreadable otherwise)."""
    if len(raw) > limit_bytes:
        raise RecordUnreadable(OVER_LIMIT, f"{len(raw):,} bytes, over the limit of {limit_bytes:,}")
    try:
        return msgspec.json.decode(raw, type=record_type)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise RecordUnreadable(UNREADABLE, f"not a {_name(record_type)}: {error}") from error


def inflate(blob: bytes, *, limit_bytes: int) -> bytes:
    """A blob's bytes, decompressed: one whole zstd frame of at most `limit_bytes`."""
    try:
        declared = zstd.get_frame_info(blob).decompressed_size
    except zstd.ZstdError as error:
        raise RecordUnreadable(UNREADABLE, f"not a zstd frame ({len(blob):,} bytes): {error}") from error
    if declared is not None and declared > limit_bytes:
        raise RecordUnreadable(
            OVER_LIMIT, f"declares {declared:,} bytes inflated, over the limit of {limit_bytes:,}"
        )
    decompressor = _decompressor(limit_bytes)
    try:
        data = decompressor.decompress(blob, max_length=limit_bytes + 1)
    except zstd.ZstdError as error:
        raise RecordUnreadable(UNREADABLE, f"a broken zstd frame: {error}") from error
    if len(data) > limit_bytes:
        raise RecordUnreadable(OVER_LIMIT, f"inflates past the limit of {limit_bytes:,} bytes")
    if not decompressor.eof or decompressor.unused_data:
        raise RecordUnreadable(UNREADABLE, "not one whole zstd frame (cut short, or bytes after it)")
    return data


def preview(blob: bytes, *, shown_bytes: int, limit_bytes: int) -> str:
    """The first `shown_bytes` of what a blob holds, as text: inflated when it is a frame whose window
    keeps to `limit_bytes`, else the bytes as they are."""
    try:
        shown = _decompressor(limit_bytes).decompress(blob, max_length=shown_bytes)
    except zstd.ZstdError:
        shown = blob
    return shown[:shown_bytes].decode(errors="backslashreplace")


def _decompressor(limit_bytes: int) -> zstd.ZstdDecompressor:
    """A decompressor whose window (allocated before any output) is no larger than the ceiling needs."""
    window_log = min(max(limit_bytes.bit_length(), MIN_WINDOW_LOG), MAX_WINDOW_LOG)
    return zstd.ZstdDecompressor(options={zstd.DecompressionParameter.window_log_max: window_log})


def _name(record_type: Any) -> str:
    return getattr(record_type, "__name__", str(record_type))
