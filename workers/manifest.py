"""The manifest: the list of committed objects of a run, one small JSON object per part.

A part is committed the moment its manifest entry is created (conditionally: the first writer of
`manifest/part-N.json` wins). Readers trust only objects named by an entry; any other object under
`data/` is an orphan of an interrupted flush, removed by `python -m producer gc`.
"""

from __future__ import annotations

import msgspec

from inference.records import Record
from workers.storage import ObjectStore, open_store

MANIFEST_PREFIX = "manifest/"
DATA_PREFIX = "data/"
SETTINGS_KEY = "run.json"
CHECKSUM_PREFIX_CHARS = 16


class ManifestEntry(Record, frozen=True):
    part: int
    key: str
    count: int
    bytes: int
    sha256: str
    committed_at: float


def manifest_key(part: int) -> str:
    return f"{MANIFEST_PREFIX}part-{part:06d}.json"


def data_key(part: int, sha256: str) -> str:
    return f"{DATA_PREFIX}part-{part:06d}-{sha256[:CHECKSUM_PREFIX_CHARS]}.parquet"


def encode_entry(entry: ManifestEntry) -> bytes:
    return msgspec.json.encode(entry)


def decode_entry(raw: bytes) -> ManifestEntry:
    return msgspec.json.decode(raw, type=ManifestEntry)


def read_manifest(store: ObjectStore) -> list[ManifestEntry]:
    entries = [decode_entry(store.get(info.key)) for info in store.list(MANIFEST_PREFIX)]
    return sorted(entries, key=lambda entry: entry.part)


def committed_locations(output_url: str) -> list[str]:
    """Where each committed object lives, as a path (folder output) or an s3:// URL, in part order."""
    base = output_url.removeprefix("file://").rstrip("/")
    return [f"{base}/{entry.key}" for entry in read_manifest(open_store(output_url))]
