"""An export, in two passes over a run's committed output: judge every row, then write the shards.

The first pass decides each row (kept, or dropped and why) and counts its loss tokens; an export
whose rows would not train is refused there, before anything is written. The second pass renders
the kept rows, in output order, into shards of `shard_rows` rows.

The destination is exactly once, the way the run's output is:
- `.export/plan.json` is written first and names everything the files depend on (the source's
  parts and checksums, the format and filters, draftgen's version). An export into a destination
  holding another plan is refused.
- each shard is put whole, then its record `.export/shards/<n>.json`; a re-run skips the shards
  with a record and renders only the parts the missing ones need. Shards are deterministic, so
  the files after a crash and a re-run are the files of an uninterrupted export.
- `README.md` (the dataset card) and last `export.json` (the shards, their checksums and the
  figures): the export is complete when `export.json` exists.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from producer.export.card import render_card
from producer.export.errors import ExportError
from producer.export.formats import (
    ExportFormat,
    LossSource,
    RowSource,
    ThinkingStyle,
    loss_tokens,
    prompt_tokens,
    render,
    response_tokens,
    turn_completions,
)
from producer.export.loss_check import LossCheckSettings, LossStats
from producer.export.records import ExportPlan, ExportRecord
from producer.export.selection import Selection, SelectionCounts
from producer.export.shards import (
    DEFAULT_SHARD_ROWS,
    Compression,
    ShardDone,
    ShardWriter,
    shard_count,
    shard_key,
)
from producer.export.source import RunOutput
from workers.errors import ObjectMissing
from workers.record.object_store import ObjectStore

PLAN_KEY = ".export/plan.json"
SHARD_RECORDS_PREFIX = ".export/shards/"
RECORD_KEY = "export.json"
CARD_KEY = "README.md"

TokenCounter = Callable[[str], int]


class ExportRefused(ExportError):
    """The rows would not train (the loss-token check), or no row is left to export."""


class DestinationTaken(ExportError):
    """The destination holds another export: its files would mix with this one's."""


class ProgressSink(Protocol):
    def phase(self, description: str, total: int) -> None: ...
    def advance(self, rows: int) -> None: ...


class NoProgress:
    def phase(self, description: str, total: int) -> None:
        pass

    def advance(self, rows: int) -> None:
        pass


@dataclass(frozen=True)
class ExportSettings:
    run: str
    format: ExportFormat
    selection: Selection
    thinking: ThinkingStyle = ThinkingStyle.SEPARATE
    shard_rows: int = DEFAULT_SHARD_ROWS
    compression: Compression = Compression.NONE
    loss: LossCheckSettings = field(default_factory=LossCheckSettings)
    tokenizer_name: str | None = None  # names the tokenizer counting loss tokens when ids are absent
    force: bool = False  # export even when the loss-token check refuses


@dataclass
class TokenTotals:
    prompt: int = 0
    response: int = 0
    reasoning: int = 0
    loss_sources: dict[str, int] = field(default_factory=dict)


@dataclass
class Scan:
    """The first pass: every row decided and counted."""

    counts: SelectionCounts
    loss: LossStats
    tokens: TokenTotals
    kept_per_part: list[int]


def draftgen_version() -> str:
    try:
        return importlib.metadata.version("draftgen")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def scan_output(
    output: RunOutput,
    settings: ExportSettings,
    *,
    tokenizer: TokenCounter | None = None,
    progress: ProgressSink | None = None,
) -> Scan:
    """Decide every committed row and count the kept rows' loss tokens."""
    progress = progress or NoProgress()
    progress.phase("checking rows", output.committed_rows)
    scan = Scan(SelectionCounts(), LossStats(), TokenTotals(), [])
    sources: dict[str, int] = {}
    for entry in output.parts:
        kept = 0
        completions = output.completions(entry)
        for completion in completions:
            reason = settings.selection.drop_reason(completion)
            scan.counts.count(settings.selection, completion, reason)
            if reason is not None:
                continue
            kept += 1
            for turn in turn_completions(completion):  # the loss check counts every generated turn
                counted = loss_tokens(turn, tokenizer)
                sources[counted.source.value] = sources.get(counted.source.value, 0) + 1
                scan.loss.add(counted.count, turn.quality, reasoning_tokens=turn.usage.reasoning_tokens)
                scan.tokens.prompt += prompt_tokens(turn)
                scan.tokens.response += response_tokens(turn)
                scan.tokens.reasoning += turn.usage.reasoning_tokens
        scan.kept_per_part.append(kept)
        progress.advance(len(completions))
    scan.tokens.loss_sources = {source.value: sources.get(source.value, 0) for source in LossSource}
    return scan


def refusal(scan: Scan, settings: ExportSettings) -> str | None:
    """Why these rows must not reach a trainer, or None."""
    counts = scan.counts
    if counts.kept == 0:
        dropped = ", ".join(f"{reason} {rows:,}" for reason, rows in counts.dropped.most_common())
        qualities = ", ".join(f"{label} {rows:,}" for label, rows in counts.qualities.most_common())
        return (
            f"no row is left to export: of {counts.committed:,} committed rows, dropped {dropped or 'none'}"
            f" (qualities: {qualities or 'none'}). Include more labels with --include, or fix the run."
        )
    verdict = scan.loss.verdict(settings.loss)
    if verdict.passed:
        return None
    return verdict.describe()


def plan_export(output: RunOutput, settings: ExportSettings, scan: Scan) -> ExportPlan:
    selection = settings.selection
    return ExportPlan(
        run=settings.run,
        source_url=output.store.url,
        source_fingerprint=output.fingerprint(),
        format=settings.format.value,
        thinking=settings.thinking.value,
        include=sorted(label.value for label in selection.include),
        max_length=selection.max_length,
        over_length=selection.over_length.value,
        shard_rows=settings.shard_rows,
        compression=settings.compression.value,
        tokenizer=settings.tokenizer_name,
        rows=scan.counts.kept,
        shards=shard_count(scan.counts.kept, settings.shard_rows),
        draftgen_version=draftgen_version(),
    )


def _read(store: ObjectStore, key: str) -> bytes | None:
    try:
        return store.get(key)
    except ObjectMissing:
        return None


def finished_export(dest: ObjectStore, plan: ExportPlan) -> ExportRecord | None:
    """The destination's complete export of this very plan; refuses any other export there."""
    raw = _read(dest, RECORD_KEY)
    if raw is not None:
        record = msgspec.json.decode(raw, type=ExportRecord)
        if record.plan != plan:
            raise DestinationTaken(
                f"{dest.url} holds another export ({record.plan.format} of run {record.plan.run}, "
                f"{record.plan.rows:,} rows): choose another --to, or remove it first"
            )
        return record
    raw_plan = _read(dest, PLAN_KEY)
    if raw_plan is not None and msgspec.json.decode(raw_plan, type=ExportPlan) != plan:
        raise DestinationTaken(
            f"{dest.url} holds an unfinished export with other settings or of other data: re-run that "
            "export to finish it, or choose another --to, or remove it first"
        )
    return None


def _shard_records(dest: ObjectStore, plan: ExportPlan) -> dict[int, ShardDone]:
    done: dict[int, ShardDone] = {}
    for info in dest.list(SHARD_RECORDS_PREFIX):
        record = msgspec.json.decode(dest.get(info.key), type=ShardDone)
        index = int(info.key.removeprefix(SHARD_RECORDS_PREFIX).removesuffix(".json"))
        if index < plan.shards and record.key == shard_key(index, plan.shards, Compression(plan.compression)):
            done[index] = record
    return done


def write_shards(
    output: RunOutput,
    dest: ObjectStore,
    settings: ExportSettings,
    plan: ExportPlan,
    scan: Scan,
    progress: ProgressSink,
) -> list[ShardDone]:
    """Render the kept rows into the shards the destination lacks."""
    done = _shard_records(dest, plan)
    size, compression, kept_total = settings.shard_rows, settings.compression, plan.rows
    progress.phase("writing shards", kept_total)
    row = 0
    writer: ShardWriter | None = None
    try:
        for entry, kept in zip(output.parts, scan.kept_per_part, strict=True):
            if kept == 0:
                continue
            touched = range(row // size, (row + kept - 1) // size + 1)
            if all(index in done for index in touched):
                row += kept
                progress.advance(kept)
                continue
            assert entry.key is not None
            source = RowSource(run=settings.run, part=entry.key, column_types=output.settings.column_types)
            for completion in output.completions(entry):
                if settings.selection.drop_reason(completion) is not None:
                    continue
                index = row // size
                row += 1
                if index not in done:
                    if writer is None:
                        writer = ShardWriter.open(shard_key(index, plan.shards, compression), compression)
                    for rendered in render(
                        completion, settings.format, source=source, thinking=settings.thinking
                    ):
                        writer.add(rendered)
                    if row % size == 0 or row == kept_total:
                        done[index] = writer.finish(dest)
                        writer = None
                        dest.put(f"{SHARD_RECORDS_PREFIX}{index:05d}.json", msgspec.json.encode(done[index]))
            progress.advance(kept)
    finally:
        if writer is not None:
            writer.discard()
    if row != kept_total or len(done) != plan.shards:
        raise ExportError(
            f"{output.store.url} changed during the export ({row:,} rows now, {kept_total:,} when checked): "
            "run the export again"
        )
    return [done[index] for index in range(plan.shards)]


def export_record(
    plan: ExportPlan, shards: list[ShardDone], scan: Scan, settings: ExportSettings
) -> ExportRecord:
    counts = scan.counts
    return ExportRecord(
        plan=plan,
        shards=shards,
        committed_rows=counts.committed,
        dropped=dict(counts.dropped.most_common()),
        dropped_qualities=dict(counts.dropped_qualities.most_common()),
        over_length_rows=counts.over_length,
        qualities=dict(counts.qualities.most_common()),
        finish_reasons=dict(counts.finish_reasons.most_common()),
        tokens={
            "prompt": scan.tokens.prompt,
            "response": scan.tokens.response,
            "reasoning": scan.tokens.reasoning,
        },
        loss_tokens=scan.loss.summary(settings.loss) | {"sources": scan.tokens.loss_sources},
        forced=settings.force and refusal(scan, settings) is not None,
    )


@dataclass(frozen=True)
class ExportResult:
    record: ExportRecord
    already_complete: bool  # the destination held this very export: nothing was written


def run_export(
    output: RunOutput,
    dest: ObjectStore,
    settings: ExportSettings,
    scan: Scan,
    *,
    progress: ProgressSink | None = None,
) -> ExportResult:
    """Write the export `scan` judged. Refuses rows that would not train unless `settings.force`."""
    progress = progress or NoProgress()
    reason = refusal(scan, settings)
    if reason is not None and (scan.counts.kept == 0 or not settings.force):
        raise ExportRefused(reason)
    plan = plan_export(output, settings, scan)
    finished = finished_export(dest, plan)
    if finished is not None:
        return ExportResult(finished, already_complete=True)
    dest.put(PLAN_KEY, msgspec.json.encode(plan))
    shards = write_shards(output, dest, settings, plan, scan, progress)
    record = export_record(plan, shards, scan, settings)
    card = render_card(record, output.settings, output.server_facts(), scan.loss.render_text())
    dest.put(CARD_KEY, card.encode())
    dest.put(RECORD_KEY, msgspec.json.encode(record))
    return ExportResult(record, already_complete=False)
