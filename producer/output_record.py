"""Reading a run's record from its object store alone: what was enqueued, rejected, committed, dead-lettered.

Everything here trusts only what the store holds: the manifest and the objects it names, and the
content-keyed `enqueued/` and `rejected/` objects `enqueue` writes. `verify --output` and `recover`
stand on it, so completeness can be proven with Redis gone.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from inference.records import DeadLetter
from producer.enqueue import StoredRejection
from producer.fingerprints import EnqueuedChunk, decode_enqueued
from workers.errors import ObjectMissing
from workers.record.jsonl_io import from_jsonl
from workers.record.manifest import ENQUEUED_PREFIX, REJECTED_PREFIX, ManifestEntry, read_manifest
from workers.record.object_store import ObjectStore


@dataclass
class CommittedRecord:
    entries: list[ManifestEntry] = field(default_factory=list)
    completed: Counter[str] = field(default_factory=Counter)  # prompt id -> committed completions
    dead: dict[str, DeadLetter] = field(default_factory=dict)
    dead_occurrences: Counter[str] = field(default_factory=Counter)
    broken_objects: list[str] = field(default_factory=list)  # absent, or checksum differs from the manifest


def _checked(store: ObjectStore, key: str, sha256: str | None, record: CommittedRecord) -> bytes | None:
    try:
        data = store.get(key)
    except ObjectMissing:
        record.broken_objects.append(f"{key}: listed in the manifest but absent")
        return None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        record.broken_objects.append(f"{key}: checksum differs from the manifest")
    return data


def read_committed(
    store: ObjectStore,
    on_entry: Callable[[int, int], None] | None = None,
    *,
    completions: bool = True,
) -> CommittedRecord:
    """Every committed part's prompt ids and dead letters, checksums checked; `on_entry(done, total)`
    after each manifest entry. With `completions=False`, the dead letters only: no data part is read."""
    from workers.record.parquet_io import prompt_ids_in  # pyarrow only where a part is read

    record = CommittedRecord(entries=read_manifest(store))
    for done, entry in enumerate(record.entries, start=1):
        if completions and entry.key is not None:
            data = _checked(store, entry.key, entry.sha256, record)
            if data is not None:
                record.completed.update(prompt_ids_in(data))
        if entry.dead is not None:
            dead_data = _checked(store, entry.dead.key, entry.dead.sha256, record)
            for letter in from_jsonl(dead_data, DeadLetter) if dead_data is not None else []:
                record.dead[letter.prompt_id] = letter
                record.dead_occurrences[letter.prompt_id] += 1
        if on_entry is not None:
            on_entry(done, len(record.entries))
    return record


def read_enqueued_ids(store: ObjectStore) -> set[str]:
    """Every id any enqueue of the run claimed (objects may overlap after a crash: a set absorbs that)."""
    ids: set[str] = set()
    for chunk in read_enqueued_chunks(store):
        ids.update(chunk.ids)
    return ids


def read_enqueued_chunks(store: ObjectStore) -> Iterator[EnqueuedChunk]:
    """Each chunk's ids with the fingerprints of its explicit ones (none in outputs written before)."""
    for info in store.list(ENQUEUED_PREFIX):
        yield decode_enqueued(store.get(info.key))


def read_rejections(store: ObjectStore) -> list[StoredRejection]:
    found: dict[tuple[str, str, int], StoredRejection] = {}
    for info in store.list(REJECTED_PREFIX):
        for stored in from_jsonl(store.get(info.key), StoredRejection):
            found[(stored.source, stored.rejected.file, stored.rejected.row)] = stored
    return list(found.values())
