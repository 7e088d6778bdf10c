"""The manifest: the list of committed objects of a run, one small JSON object per part.

A part is committed the moment its manifest entry is created (conditionally: the first writer of
`manifest/part-N.json` wins). A part names a Parquet object of completions under `data/`, a JSONL
object of dead letters under `dead/`, or both. Readers trust only objects named by an entry; any
other object under `data/` or `dead/` is an orphan of an interrupted flush, removed by
`python -m producer gc`.

Beside them, written by the uploader before the entry that needs it: `servers/<id>.json`, the facts
of each server the part's rows name (see inference/server_facts.py); and before it takes them out of
Redis, `quarantine/<sha>.jsonl`: the records it kept apart (workers/state/quarantine.py), never listed
in the manifest and never read as data. Written by `enqueue`:
`run.json` (the pinned settings), `enqueued/` (the ids each enqueue step claimed, with the
fingerprints of the explicit ones) and `rejected/` (the rows it refused). Their keys derive from their
content, so a re-run writes the same objects again: each is complete the moment it exists, and needs
no entry.
"""

from __future__ import annotations

import hashlib

import msgspec

from core.records import Record
from workers.record.object_store import ObjectStore
from workers.record.output_places import SETTINGS_KEY as SETTINGS_KEY  # an output is known by its run.json
from workers.record.storage import open_store

MANIFEST_PREFIX = "manifest/"
DATA_PREFIX = "data/"
DEAD_PREFIX = "dead/"
ENQUEUED_PREFIX = "enqueued/"
REJECTED_PREFIX = "rejected/"
SERVERS_PREFIX = "servers/"
QUARANTINE_PREFIX = "quarantine/"
CHECKSUM_PREFIX_CHARS = 16


class ObjectRef(Record, frozen=True):
    key: str
    count: int
    bytes: int
    sha256: str


class ManifestEntry(Record, frozen=True):
    part: int
    key: str | None  # the part's completions (Parquet); None when it holds only dead letters
    count: int
    bytes: int
    sha256: str | None
    committed_at: float
    dead: ObjectRef | None = None  # the part's dead letters (JSONL), if any
    run: str = ""  # the run that committed it (entries of older versions leave it empty)


def manifest_key(part: int) -> str:
    return f"{MANIFEST_PREFIX}part-{part:06d}.json"


def data_key(part: int, sha256: str) -> str:
    return f"{DATA_PREFIX}part-{part:06d}-{sha256[:CHECKSUM_PREFIX_CHARS]}.parquet"


def server_key(facts_id: str) -> str:
    return f"{SERVERS_PREFIX}{facts_id}.json"


def dead_key(part: int, sha256: str) -> str:
    return f"{DEAD_PREFIX}part-{part:06d}-{sha256[:CHECKSUM_PREFIX_CHARS]}.jsonl"


def content_key(prefix: str, data: bytes, suffix: str) -> str:
    """A key that names its content: writing the same content again writes the same object."""
    return f"{prefix}{hashlib.sha256(data).hexdigest()[: CHECKSUM_PREFIX_CHARS * 2]}{suffix}"


def encode_entry(entry: ManifestEntry) -> bytes:
    return msgspec.json.encode(entry)


def decode_entry(raw: bytes) -> ManifestEntry:
    return msgspec.json.decode(raw, type=ManifestEntry)


def read_manifest(store: ObjectStore) -> list[ManifestEntry]:
    entries = [decode_entry(store.get(info.key)) for info in store.list(MANIFEST_PREFIX)]
    return sorted(entries, key=lambda entry: entry.part)


def completion_keys(entries: list[ManifestEntry]) -> list[str]:
    """The committed completion objects, in part order."""
    return [entry.key for entry in entries if entry.key is not None]


def committed_locations(output: str) -> list[str]:
    """Where each committed completions object lives, as a path (folder) or an s3:// URL, in part order."""
    base = output.removeprefix("file://").rstrip("/")
    return [f"{base}/{key}" for key in completion_keys(read_manifest(open_store(output)))]
