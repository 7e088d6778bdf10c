"""Remove orphans: objects under `data/` or `dead/` that no manifest entry names (interrupted flushes)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import chain

from workers.manifest import DATA_PREFIX, DEAD_PREFIX, completion_keys, read_manifest
from workers.object_store import ObjectStore

# A flush writes its object moments before its manifest entry; younger objects may be mid-commit.
DEFAULT_MIN_ORPHAN_AGE_S = 3600.0


@dataclass
class GcReport:
    removed: list[str] = field(default_factory=list)
    kept_young: list[str] = field(default_factory=list)
    bytes_removed: int = 0


def collect_orphans(
    store: ObjectStore, *, min_age_s: float = DEFAULT_MIN_ORPHAN_AGE_S, dry_run: bool = False
) -> GcReport:
    entries = read_manifest(store)
    referenced = set(completion_keys(entries)) | {entry.dead.key for entry in entries if entry.dead}
    report = GcReport()
    now = time.time()
    for info in chain(store.list(DATA_PREFIX), store.list(DEAD_PREFIX)):
        if info.key in referenced:
            continue
        if now - info.modified_at < min_age_s:
            report.kept_young.append(info.key)
            continue
        if not dry_run:
            store.delete(info.key)
        report.removed.append(info.key)
        report.bytes_removed += info.size
    return report
