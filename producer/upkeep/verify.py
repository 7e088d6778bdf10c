"""Check a run's output against its input: every enqueued prompt committed exactly once, or dead-lettered.

Reads only what readers trust: the manifest in the object store and the objects it names (their
checksums included), compared with the ids `enqueue` recorded in the object store, and, when Redis
is at hand, with the ids the run holds there and its dead letters too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from workers.record.object_store import ObjectStore
from workers.record.quarantine_output import read_quarantined
from workers.record.reading import read_committed, read_enqueued_ids
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.quarantine import Quarantine, QuarantinedRecord

EXAMPLES_SHOWN = 5


@dataclass
class VerifyReport:
    enqueued: int = 0
    committed: int = 0
    dead_lettered: int = 0
    dead_committed: int = 0  # dead letters in the object store
    awaiting_upload: int = 0
    objects: int = 0
    missing: list[str] = field(default_factory=list)  # enqueued, neither committed nor dead-lettered
    duplicated: list[str] = field(default_factory=list)  # committed more than once
    unexpected: list[str] = field(default_factory=list)  # committed, but never enqueued
    committed_and_dead: list[str] = field(default_factory=list)
    broken_objects: list[str] = field(default_factory=list)  # missing, or checksum differs from the manifest
    redis_manifest_entries: int = 0
    # records kept apart, never committed (from the output's quarantine/ and Redis): not a failure by
    # themselves; a real prompt of theirs not generated again is `missing`
    quarantined: list[QuarantinedRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.duplicated
            or self.unexpected
            or self.committed_and_dead
            or self.broken_objects
        )


def verify_run(
    store: ObjectStore,
    run: str,
    client: redis.Redis | None = None,
    *,
    on_entry: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Compare what the run was asked to do with what its output holds. With `client`, Redis's view
    joins in (dead letters not yet committed, ids of runs older than the `enqueued/` objects);
    without it, the object store alone is the proof."""
    committed = read_committed(store, on_entry)
    enqueued = read_enqueued_ids(store)
    dead = set(committed.dead)
    report = VerifyReport()
    quarantined = {entry.field: entry for entry in read_quarantined(store)}
    if client is not None:
        quarantined |= {entry.field: entry for entry in Quarantine(client, run).entries()}
        keys = RunKeys(run)
        enqueued |= RunLedger(client, run).enqueued_ids()
        dead |= {raw.decode() for raw in client.hkeys(keys.dead)}
        report.awaiting_upload = int(client.zcard(keys.staged_index))
        report.redis_manifest_entries = int(client.llen(keys.manifest))
    done = set(committed.completed)
    report.objects = len(committed.entries)
    report.broken_objects = committed.broken_objects
    report.enqueued = len(enqueued)
    report.committed = len(done)
    report.dead_lettered = len(dead)
    report.dead_committed = len(committed.dead)
    report.duplicated = sorted(
        {pid for pid, count in committed.completed.items() if count > 1}
        | {pid for pid, count in committed.dead_occurrences.items() if count > 1}
    )
    report.unexpected = sorted((done | dead) - enqueued)
    report.committed_and_dead = sorted(done & dead)
    report.missing = sorted(enqueued - done - dead)
    report.quarantined = sorted(quarantined.values(), key=lambda entry: (entry.at, entry.field))
    return report


def describe(report: VerifyReport) -> list[str]:
    lines = [
        f"enqueued          {report.enqueued}",
        f"committed         {report.committed} in {report.objects} objects",
        f"dead-lettered     {report.dead_lettered} ({report.dead_committed} committed to the output)",
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
    if report.quarantined:
        shown = ", ".join(
            f"{entry.kind} {entry.id} ({entry.reason})" for entry in report.quarantined[:EXAMPLES_SHOWN]
        )
        more = " …" if len(report.quarantined) > EXAMPLES_SHOWN else ""
        lines.append(f"quarantined (kept apart, never committed): {len(report.quarantined)} ({shown}{more})")
    if report.missing and report.awaiting_upload:
        lines.append(f"note: {report.awaiting_upload} completions are generated and awaiting upload")
    lines.append("OK: every prompt committed exactly once or dead-lettered" if report.ok else "FAILED")
    return lines
