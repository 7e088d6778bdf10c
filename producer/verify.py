"""Check a run's output against its input: every enqueued prompt committed exactly once, or dead-lettered.

Reads only what readers trust: the manifest in the object store and the objects it names (their
checksums included), compared with the run's `enqueued` set and dead letters in Redis.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import redis

from workers.keys import RunKeys
from workers.manifest import read_manifest
from workers.parquet_io import prompt_ids_in
from workers.storage import ObjectMissing, ObjectStore

SCAN_COUNT = 10_000
EXAMPLES_SHOWN = 5


@dataclass
class VerifyReport:
    enqueued: int = 0
    committed: int = 0
    dead_lettered: int = 0
    awaiting_upload: int = 0
    objects: int = 0
    missing: list[str] = field(default_factory=list)  # enqueued, neither committed nor dead-lettered
    duplicated: list[str] = field(default_factory=list)  # committed more than once
    unexpected: list[str] = field(default_factory=list)  # committed, but never enqueued
    committed_and_dead: list[str] = field(default_factory=list)
    broken_objects: list[str] = field(default_factory=list)  # missing, or checksum differs from the manifest
    redis_manifest_entries: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.duplicated
            or self.unexpected
            or self.committed_and_dead
            or self.broken_objects
        )


def _members(client: redis.Redis, key: str) -> set[str]:
    return {raw.decode() for raw in client.sscan_iter(key, count=SCAN_COUNT)}


def verify_run(client: redis.Redis, run: str, store: ObjectStore) -> VerifyReport:
    keys = RunKeys(run)
    report = VerifyReport()
    occurrences: Counter[str] = Counter()
    for entry in read_manifest(store):
        report.objects += 1
        try:
            data = store.get(entry.key)
        except ObjectMissing:
            report.broken_objects.append(f"{entry.key}: listed in the manifest but absent")
            continue
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            report.broken_objects.append(f"{entry.key}: checksum differs from the manifest")
        occurrences.update(prompt_ids_in(data))
    enqueued = _members(client, keys.enqueued)
    dead = {raw.decode() for raw in client.hkeys(keys.dead)}
    committed = set(occurrences)
    report.enqueued = len(enqueued)
    report.committed = len(committed)
    report.dead_lettered = len(dead)
    report.awaiting_upload = int(client.zcard(keys.staged_index))
    report.redis_manifest_entries = int(client.llen(keys.manifest))
    report.duplicated = sorted(pid for pid, count in occurrences.items() if count > 1)
    report.unexpected = sorted(committed - enqueued)
    report.committed_and_dead = sorted(committed & dead)
    report.missing = sorted(enqueued - committed - dead)
    return report


def describe(report: VerifyReport) -> list[str]:
    lines = [
        f"enqueued          {report.enqueued}",
        f"committed         {report.committed} in {report.objects} objects",
        f"dead-lettered     {report.dead_lettered}",
    ]
    problems = [
        ("missing (neither committed nor dead-lettered)", report.missing),
        ("committed more than once", report.duplicated),
        ("committed but never enqueued", report.unexpected),
        ("both committed and dead-lettered", report.committed_and_dead),
        ("broken objects", report.broken_objects),
    ]
    for label, items in problems:
        if items:
            shown = ", ".join(items[:EXAMPLES_SHOWN]) + (" …" if len(items) > EXAMPLES_SHOWN else "")
            lines.append(f"{label}: {len(items)} ({shown})")
    if report.missing and report.awaiting_upload:
        lines.append(f"note: {report.awaiting_upload} completions are generated and awaiting upload")
    lines.append("OK: every prompt committed exactly once or dead-lettered" if report.ok else "FAILED")
    return lines
