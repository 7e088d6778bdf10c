"""The output's record of what was enqueued: one object `enqueued/<key>.json` per chunk of new ids, with the
enqueue that claimed them and the fingerprints of its explicit ids, so that `recover` rebuilds Redis's
claims and `verify` knows every prompt the run holds.
"""

from __future__ import annotations

import time

import msgspec

from core.records import Record


class EnqueueNote(Record, frozen=True):
    """One `enqueue` of the run, named in conflicts with its rows: what it read, and when (unix s)."""

    source: str
    at: float

    def describe(self, number: int) -> str:
        if not self.source:  # a gap `recover` could not fill: that enqueue claimed nothing new
            return f"enqueue {number}"
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))
        return f"enqueue {number} ({self.source} at {when})"


class EnqueuedChunk(Record, frozen=True):
    """The object `enqueued/<key>.json` of one chunk: its new ids, the enqueue that claimed them, and
    the fingerprint of each explicit id among them. (Outputs written before fingerprints were kept
    hold the ids as a bare JSON list; `decode_enqueued` reads both.)"""

    ids: list[str]
    enqueue_number: int
    note: EnqueueNote
    fingerprints: dict[str, str]  # id -> Fingerprint.encode()


def decode_enqueued(data: bytes) -> EnqueuedChunk:
    found = msgspec.json.decode(data, type=EnqueuedChunk | list[str])
    if isinstance(found, EnqueuedChunk):
        return found
    return EnqueuedChunk(ids=found, enqueue_number=0, note=EnqueueNote(source="", at=0.0), fingerprints={})
