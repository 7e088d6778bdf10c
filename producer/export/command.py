"""`python -m producer export`, once its options are parsed: scan, check, then write the shards.

Apart from the parser (producer/export/parser.py) so that other commands do not import pyarrow."""

from __future__ import annotations

import argparse
import sys
from types import TracebackType

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from core.exit_codes import EXIT_FAILED, EXIT_OK
from producer.errors import RunNotFound, SettingsError
from producer.export.exporter import (
    PLAN_KEY,
    RECORD_KEY,
    ExportRefused,
    ExportSettings,
    Scan,
    refusal,
    run_export,
    scan_output,
)
from producer.export.formats import ExportFormat, ThinkingStyle
from producer.export.loss_check import LossCheckSettings
from producer.export.parser import parse_include
from producer.export.selection import DEFAULT_MAX_LENGTH_TOKENS, OverLength, Selection
from producer.export.shards import Compression
from producer.export.source import RunOutput
from producer.export.tokenizer import load_token_counter
from producer.run_access import chosen_redis_url, pinned_settings
from producer.settings import ProducerSettings
from workers.errors import UnsupportedStoreUrl
from workers.record.storage import check_fresh_output, check_output_folder, normalise_output, open_store
from workers.state.keys import check_run_name
from workers.state.redis_client import client_for


def export_settings(args: argparse.Namespace) -> ExportSettings:
    fmt = ExportFormat(args.format)
    for name in ("shard_rows", "min_loss_tokens"):
        if getattr(args, name) < 1:
            raise SettingsError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_length is not None and args.max_length < 1:
        raise SettingsError("--max-length must be at least 1")
    if not 0.0 <= args.max_short_fraction <= 1.0:
        raise SettingsError("--max-short-fraction must be between 0 and 1")
    selection = Selection(
        format=fmt,
        include=parse_include(args.include),
        max_length=args.max_length if args.max_length is not None else DEFAULT_MAX_LENGTH_TOKENS[fmt],
        over_length=OverLength(args.over_length),
    )
    return ExportSettings(
        run=args.run,
        format=fmt,
        selection=selection,
        thinking=ThinkingStyle(args.thinking),
        shard_rows=args.shard_rows,
        compression=Compression(args.compression),
        loss=LossCheckSettings(
            min_loss_tokens=args.min_loss_tokens, max_short_fraction=args.max_short_fraction
        ),
        tokenizer_name=args.tokenizer.name if args.tokenizer else None,
        force=args.force,
    )


def _output(args: argparse.Namespace, settings: ProducerSettings) -> str:
    if args.output:
        return normalise_output(args.output)
    client = client_for(chosen_redis_url(args, settings))
    try:
        pinned = pinned_settings(client, args.run)
    except redis.RedisError as error:
        raise RunNotFound(f"Redis is not reachable ({error}): name the run's output with --output") from error
    if pinned is None:
        raise RunNotFound(f"Redis knows no run {args.run!r}: name its output with --output")
    return pinned.output


class RichProgress:
    """A progress bar on stderr, one phase after another."""

    def __init__(self) -> None:
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._bar.stop()

    def phase(self, description: str, total: int) -> None:
        if self._task is not None:
            self._bar.update(self._task, visible=False)
        self._task = self._bar.add_task(description, total=total)

    def advance(self, rows: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, rows)


def print_scan(scan: Scan, settings: ExportSettings) -> None:
    counts = scan.counts
    print(f"committed rows      {counts.committed:,}")
    print(f"to export           {counts.kept:,}")
    for reason, rows in counts.dropped.most_common():
        detail = ""
        if reason == "quality":
            detail = " (" + ", ".join(f"{q} {n:,}" for q, n in counts.dropped_qualities.most_common()) + ")"
        print(f"dropped: {reason:<10} {rows:,}{detail}")
    limit = settings.selection.max_length
    if limit is not None:
        action = (
            "dropped" if settings.selection.over_length is OverLength.DROP else "kept, cut by the trainer"
        )
        print(f"longer than {limit:,}   {counts.over_length:,} ({action})")
    if counts.without_ids:
        print(f"without token ids   {counts.without_ids:,} (loss tokens counted from text or usage)")
    print()
    print(scan.loss.render_text())


def check_export_destination(dest_url: str, source_url: str, *, allow_location: bool) -> None:
    """Refuse (SettingsError) an export into the run's own output, or anywhere an output may not go: `gc`
    of the run would take the export's files for orphans and delete them."""
    source = source_url.rstrip("/")
    if dest_url.rstrip("/") == source or dest_url.startswith(source + "/"):
        raise SettingsError(
            f"--to {dest_url}: inside the run's own output {source_url}: give a folder of its own"
        )
    try:
        check_output_folder(dest_url)
        check_fresh_output(dest_url, ours=(RECORD_KEY, PLAN_KEY), allow_shared=allow_location)
    except UnsupportedStoreUrl as error:
        raise SettingsError(f"--to: {error}") from error


def cmd_export(args: argparse.Namespace, settings: ProducerSettings) -> int:
    run = check_run_name(args.run)
    export = export_settings(args)
    tokenizer = load_token_counter(args.tokenizer) if args.tokenizer else None
    dest_url = normalise_output(args.to)
    source_url = _output(args, settings)
    check_export_destination(dest_url, source_url, allow_location=args.allow_location)
    dest = open_store(dest_url)
    output = RunOutput(open_store(source_url), run)
    print(f"run {run}: {output.store.url} -> {dest.url} ({export.format.value})")
    with RichProgress() as progress:
        scan = scan_output(output, export, tokenizer=tokenizer, progress=progress)
    print_scan(scan, export)
    reason = refusal(scan, export)
    if reason is not None and (scan.counts.kept == 0 or not export.force):
        print(f"\nrefused: {reason}", file=sys.stderr)
        print(
            "nothing was written" + ("" if scan.counts.kept == 0 else "; --force exports anyway"),
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        with RichProgress() as progress:
            result = run_export(output, dest, export, scan, progress=progress)
    except ExportRefused as error:  # the same check as above; kept for callers of run_export
        print(f"refused: {error}", file=sys.stderr)
        return EXIT_FAILED
    record = result.record
    if result.already_complete:
        print(f"\n{dest.url} already holds this export: nothing to do")
    if reason is not None:
        print(f"\nexported despite the loss-token check (--force): {reason}")
    written = sum(shard.bytes for shard in record.shards)
    print(f"\n{record.rows_described()} in {len(record.shards)} shards, {written:,} bytes")
    print(f"dataset card        {dest.url}/README.md")
    print(f"record              {dest.url}/export.json")
    return EXIT_OK
