"""The quarantine as `status` and the metrics exporter show it: how many records were kept apart, why, and
how many real prompts of theirs are still to be generated again (workers/state/quarantine.py)."""

from __future__ import annotations

from collections import Counter

import redis

from core.records import Record
from workers.record.record_checks import read_views
from workers.state.keys import RunKeys
from workers.state.quarantine import PROMPT_KINDS, Quarantine

# Entries read for the reasons and for what awaits regeneration: `status` stays quick however many
# records a broken or hostile writer staged (the count itself is always whole).
QUARANTINE_ENTRIES_READ = 10_000


class QuarantineFigures(Record, frozen=True):
    records: int  # entries in the run's quarantine
    reasons: dict[str, int]  # over the entries read
    awaiting_regeneration: int  # their real prompts neither staged, committed nor dead-lettered yet
    read: int  # entries read: fewer than `records` past QUARANTINE_ENTRIES_READ


def read_quarantine(client: redis.Redis, run: str) -> QuarantineFigures | None:
    """The run's quarantine, or None when nothing was ever quarantined."""
    quarantine = Quarantine(client, run)
    records = quarantine.count()
    if not records:
        return None
    entries = quarantine.entries(QUARANTINE_ENTRIES_READ)
    prompts = sorted({entry.id for entry in entries if entry.kind in PROMPT_KINDS})
    views = read_views(client, RunKeys(run), prompts)
    return QuarantineFigures(
        records=records,
        reasons=dict(sorted(Counter(entry.reason for entry in entries).items())),
        awaiting_regeneration=sum(view.unsettled for view in views),
        read=len(entries),
    )


def quarantine_warning(figures: QuarantineFigures | None, *, remaining: int, open_batches: int) -> str | None:
    """One line for `status`: what was kept apart, and what the operator must do, if anything."""
    if figures is None:
        return None
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in figures.reasons.items())
    over = f" of the {figures.read:,} read" if figures.read < figures.records else ""
    line = (
        f"{figures.records:,} records quarantined ({reasons}{over}): kept apart, never committed; "
        "`verify` lists them"
    )
    if figures.awaiting_regeneration:
        line += f"; {figures.awaiting_regeneration:,} real prompts of theirs are to be generated again"
    if remaining > 0 and open_batches == 0:
        line += (
            f"; {remaining:,} prompts are in no open batch (their batch was quarantined, or Redis was "
            "rebuilt): re-run `enqueue` with the same data to generate them"
        )
    return line
