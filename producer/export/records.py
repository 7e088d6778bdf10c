"""What an export writes about itself: its plan (first) and its record (`export.json`, last)."""

from __future__ import annotations

from core.records import Record
from producer.export.shards import ShardDone


class ExportPlan(Record, frozen=True):
    """Everything an export's files depend on: the same plan always writes the same bytes."""

    run: str
    source_url: str
    source_fingerprint: str
    format: str
    thinking: str
    include: list[str]
    max_length: int | None
    over_length: str
    shard_rows: int
    compression: str
    tokenizer: str | None
    rows: int  # completions exported: a conversation's per-turn rows (speculators, specforge) count once
    shards: int
    draftgen_version: str


class ExportRecord(Record, frozen=True):
    """`export.json`: the export's plan, shards and figures, written last."""

    plan: ExportPlan
    shards: list[ShardDone]
    committed_rows: int
    dropped: dict[str, int]
    dropped_qualities: dict[str, int]
    over_length_rows: int
    qualities: dict[str, int]
    finish_reasons: dict[str, int]
    tokens: dict[str, int]  # totals over the exported rows: prompt, response, reasoning
    loss_tokens: dict[str, object]
    forced: bool

    @property
    def written_rows(self) -> int:
        """The JSONL rows the shards hold (a conversation exported a row per turn counts each)."""
        return sum(shard.rows for shard in self.shards)

    def rows_described(self) -> str:
        """`466 rows (from 220 completions)`, or `220 rows` when each completion is one row."""
        written, completions = self.written_rows, self.plan.rows
        rows = f"{written:,} rows"
        return (
            rows if written == completions else f"{rows} (from {completions:,} completions, a row per turn)"
        )
