"""The quarantine in the output: the records the uploader kept apart, as JSON Lines under `quarantine/`.

Written before the records leave Redis, under content-derived keys, never listed in the manifest: no
reader takes them for data, gc leaves them alone, and `verify --output` lists them with Redis gone.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.record.manifest import QUARANTINE_PREFIX, content_key
from workers.record.object_store import ObjectStore
from workers.state.quarantine import QuarantinedRecord, decode_entry, encode_entry


def write_quarantined(store: ObjectStore, entries: Sequence[QuarantinedRecord]) -> str:
    """Keep the entries in the output; returns the object's key."""
    data = b"".join(encode_entry(entry) + b"\n" for entry in entries)
    key = content_key(QUARANTINE_PREFIX, data, ".jsonl")
    store.put(key, data)
    return key


def read_quarantined(store: ObjectStore) -> list[QuarantinedRecord]:
    """Every entry the output holds (a line that is not one is left out)."""
    found: list[QuarantinedRecord] = []
    for info in store.list(QUARANTINE_PREFIX):
        for line in store.get(info.key).splitlines():
            entry = decode_entry(line) if line.strip() else None
            if entry is not None:
                found.append(entry)
    return found
