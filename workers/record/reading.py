"""Reading a run's record from its object store alone: what was enqueued, rejected, committed, dead-lettered.

Everything here trusts only what the store holds: the manifest and the objects it names, and the
content-keyed `enqueued/` and `rejected/` objects `enqueue` writes. `verify --output`, `recover`,
`status --rejects` and the uploader's adoption of a part an interrupted flush committed stand on it,
so completeness can be proven with Redis gone.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from core.records import DeadLetter
from workers.errors import ObjectMissing
from workers.record.enqueued import EnqueuedChunk, decode_enqueued
from workers.record.jsonl_io import from_jsonl
from workers.record.manifest import ENQUEUED_PREFIX, REJECTED_PREFIX, ManifestEntry, read_manifest
from workers.record.object_store import ObjectStore
from workers.record.rejections import StoredRejection


@dataclass
class CommittedRecord:
    entries: list[ManifestEntry] = field(default_factory=list)
    completed: Counter[str] = field(default_factory=Counter)  # prompt id -> committed completions
    dead: dict[str, DeadLetter] = field(default_factory=dict)
    dead_occurrences: Counter[str] = field(default_factory=Counter)
    broken_objects: list[str] = field(default_factory=list)  # absent, or checksum differs from the manifest


@dataclass
class PartContents:
    completed: list[str] = field(default_factory=list)  # the prompt ids of the part's completions
    dead: list[DeadLetter] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)  # objects the entry names that the store lacks
    mismatched: list[str] = field(default_factory=list)  # objects read whose checksum differs (still read)

    @property
    def broken(self) -> list[str]:
        return [f"{key}: listed in the manifest but absent" for key in self.absent] + [
            f"{key}: checksum differs from the manifest" for key in self.mismatched
        ]


def _checked(store: ObjectStore, key: str, sha256: str | None, contents: PartContents) -> bytes | None:
    try:
        data = store.get(key)
    except ObjectMissing:
        contents.absent.append(key)
        return None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        contents.mismatched.append(key)
    return data


def read_part(store: ObjectStore, entry: ManifestEntry, *, completions: bool = True) -> PartContents:
    """What one committed part holds, checksums checked; with `completions=False`, its dead letters only."""
    from workers.record.parquet_io import prompt_ids_in  # pyarrow only where a part is read

    contents = PartContents()
    if completions and entry.key is not None:
        data = _checked(store, entry.key, entry.sha256, contents)
        if data is not None:
            contents.completed = prompt_ids_in(data)
    if entry.dead is not None:
        dead_data = _checked(store, entry.dead.key, entry.dead.sha256, contents)
        if dead_data is not None:
            contents.dead = from_jsonl(dead_data, DeadLetter)
    return contents


def read_committed(
    store: ObjectStore,
    on_entry: Callable[[int, int], None] | None = None,
    *,
    completions: bool = True,
) -> CommittedRecord:
    """Every committed part's prompt ids and dead letters, checksums checked; `on_entry(done, total)`
    after each manifest entry. With `completions=False`, the dead letters only: no data part is read."""
    record = CommittedRecord(entries=read_manifest(store))
    for done, entry in enumerate(record.entries, start=1):
        contents = read_part(store, entry, completions=completions)
        record.completed.update(contents.completed)
        for letter in contents.dead:
            record.dead[letter.prompt_id] = letter
            record.dead_occurrences[letter.prompt_id] += 1
        record.broken_objects.extend(contents.broken)
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
