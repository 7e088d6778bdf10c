"""Remove orphans: objects under `data/` or `dead/` of a committed part that its manifest entry does not name.

A flush writes part N's objects, then creates `manifest/part-N.json` only if absent (the commit point).
Once that entry exists it never changes, so an object of part N it does not name can never be
committed: it is an orphan of a flush that lost the race or died, and is removed. An object of a part
with no entry yet is left alone however old it is: a flush retried hours later writes the same key
again and commits it, and deleting it from a listing taken before that commit would break the part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import chain

from workers.record.manifest import DATA_PREFIX, DEAD_PREFIX, read_manifest
from workers.record.object_store import ObjectStore

PART_OF_KEY = re.compile(r"^(?:data|dead)/part-(\d+)-")


@dataclass
class GcReport:
    removed: list[str] = field(default_factory=list)
    kept_uncommitted: list[str] = field(default_factory=list)  # their part has no entry yet
    bytes_removed: int = 0


def collect_orphans(store: ObjectStore, *, dry_run: bool = False) -> GcReport:
    named = {
        entry.part: {key for key in (entry.key, entry.dead.key if entry.dead else None) if key}
        for entry in read_manifest(store)
    }
    report = GcReport()
    for info in chain(store.list(DATA_PREFIX), store.list(DEAD_PREFIX)):
        found = PART_OF_KEY.match(info.key)
        part = int(found.group(1)) if found else None
        if part is None or part not in named:
            report.kept_uncommitted.append(info.key)
            continue
        if info.key in named[part]:
            continue
        if not dry_run:
            store.delete(info.key)
        report.removed.append(info.key)
        report.bytes_removed += info.size
    return report
