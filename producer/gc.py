"""Remove orphans: objects under `data/` that no manifest entry names (left by interrupted flushes)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from workers.manifest import DATA_PREFIX, read_manifest
from workers.storage import ObjectStore

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
    referenced = {entry.key for entry in read_manifest(store)}
    report = GcReport()
    now = time.time()
    for info in store.list(DATA_PREFIX):
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
