"""`python -m producer enqueue`: validate everything (environment, Redis, settings, input, output), then
write run.json, pin the settings and enqueue. A refusal leaves nothing pinned and nothing written."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from collections.abc import Iterator

import redis

from core.exit_codes import EXIT_INTERRUPTED, EXIT_OK
from core.records import Prompt
from core.run_settings.layers import OUTPUT_KEY, StatedSettings, read_toml, resolve, stated_settings
from core.run_settings.model import DEFAULT_OUTPUT_ROOT, RunSettings
from core.run_settings.options import stated_options
from intake.data_files import check_data
from intake.limits import ReadLimits, row_limit_bytes
from intake.rejected import RejectedRow
from intake.row_fields import RowFields
from producer.enqueue.enqueuer import Enqueuer, EnqueueReport, check_same_settings, pin_settings
from producer.enqueue.id_sources import IdSources
from producer.enqueue.kept_columns import with_kept_columns
from producer.enqueue.replicas import ReplicasUnknown, wait_for_replicas
from producer.errors import (
    OutputError,
    SourceError,
)
from producer.progress_lines import ProgressLines
from producer.run_access import (
    checked_output_store,
    chosen_redis_url,
    connect_redis,
    other_runs_settings,
    pinned_settings,
)
from producer.settings import OUTPUT_ENV, ProducerSettings
from workers.broker.broker import sending_app
from workers.errors import UnsupportedStoreUrl
from workers.record.manifest import SETTINGS_KEY
from workers.record.object_store import ObjectStore
from workers.record.output_pin import overlapping_run_output, write_run_json
from workers.record.storage import check_fresh_output, normalise_output, run_output_under
from workers.settings import WorkerSettings
from workers.state.keys import check_run_name
from workers.state.redis_client import redis_now_s

LOOKAHEAD_REJECTIONS = 10_000  # rows read, before anything is pinned, to find the first prompt
MOST_ROWS_SHARE = 0.5  # above this share of rejected rows, enqueue warns at the end


def _print_enqueue_report(report: EnqueueReport) -> None:
    batches = "batch" if report.batches == 1 else "batches"
    print(f"new                 {report.new} prompts in {report.batches} {batches}")
    print(f"already there       {report.already_there}")
    if report.requeued_orphans:
        print(f"requeued            {report.requeued_orphans} (held by the run, by no batch: after recover)")
        if report.requeued_changed:
            print(
                f"  {report.requeued_changed} of them with other content than first enqueued: generated "
                "as they are now (the first text was lost with Redis)"
            )
    print(f"duplicate ids       {report.duplicates_in_input} (same id and content in the input; kept one)")
    if report.conflict_count:
        print(f"conflicting ids     {report.conflict_count} (same id, other content: kept the first version)")
        _print_rows(report.conflicts, report.conflict_count)
    print(f"rejected rows       {report.rejected_count}")
    _print_rows(report.rejected, report.rejected_count)
    if report.republished_batches:
        print(f"republished         {report.republished_batches} batches a previous enqueue left unpublished")


def _print_rows(shown: list[RejectedRow], count: int) -> None:
    for rejected in shown:
        print(f"  {rejected.describe()}")
    if count > len(shown):
        print(f"  … {count - len(shown)} more: `python -m producer rejects --run RUN` lists every one")


def _with_first_prompt(items: Iterator[Prompt | RejectedRow], data: str) -> Iterator[Prompt | RejectedRow]:
    """The same stream, refused (SourceError) before anything is pinned when it holds no row, or when its
    rows up to the end, or the first LOOKAHEAD_REJECTIONS of them, are all rejected: a run of nothing is a
    mistake (most often columns of other names: the reason says which it has)."""
    rejected: list[RejectedRow] = []
    for item in items:
        if isinstance(item, Prompt):
            return itertools.chain(rejected, [item], items)
        rejected.append(item)
        if len(rejected) >= LOOKAHEAD_REJECTIONS:
            break
    if not rejected:
        raise SourceError(f"{data}: holds no rows (empty, or only blank lines): nothing to enqueue")
    which = "its first" if len(rejected) >= LOOKAHEAD_REJECTIONS else "all its"
    raise SourceError(
        f"{data}: {which} {len(rejected):,} rows are rejected, nothing to enqueue; {rejected[0].describe()}"
    )


def _warn_when_most_rows_rejected(report: EnqueueReport, run: str) -> None:
    rows = (
        report.new
        + report.already_there
        + report.duplicates_in_input
        + report.conflict_count
        + report.rejected_count
    )
    if rows and report.rejected_count / rows > MOST_ROWS_SHARE:
        print(
            f"warning: {report.rejected_count:,} of {rows:,} rows ({report.rejected_count / rows:.0%}) were "
            f"rejected: is this the dataset you meant? `python -m producer rejects --run {run}` lists them",
            file=sys.stderr,
        )


def _output(url: str, where: str) -> str:
    """The output as the run pins it (a folder as an absolute file:// URL), or OutputError naming where."""
    try:
        return normalise_output(url)
    except UnsupportedStoreUrl as error:
        raise OutputError(f"{where}: {error}") from error


def _with_output_checked(stated: StatedSettings) -> StatedSettings:
    """A stated output checked before Redis or the output is asked: a URL of no kind cannot be a run's."""
    if OUTPUT_KEY not in stated.values:
        return stated
    return stated.with_value(OUTPUT_KEY, _output(stated.values[OUTPUT_KEY], stated.origins[OUTPUT_KEY]))


def _new_run_output(settings: ProducerSettings, run: str) -> str:
    """The output of a new run that states none: its own folder (or prefix) under the output root."""
    try:
        return run_output_under(settings.output_root, run)
    except UnsupportedStoreUrl as error:
        raise OutputError(f"the output root ({OUTPUT_ENV} or {DEFAULT_OUTPUT_ROOT}): {error}") from error


def _check_output_apart(client: redis.Redis, given: RunSettings) -> None:
    """A new run's output is no other run's, holds none and lies inside none (OutputError naming both):
    `gc` and `verify` of one would count the other's files as its own."""
    for other in other_runs_settings(client, given.run):
        if reason := overlapping_run_output(given.run, given.output, other):
            raise OutputError(f"--output: {reason}; give run {given.run!r} an --output of its own")


def _validated_run(
    settings: ProducerSettings,
    client: redis.Redis,
    run: str,
    stated: StatedSettings,
    pinned: RunSettings | None,
) -> RunSettings:
    """The run's settings, stated over `pinned` or new, refused when they differ from the pinned ones or
    when a new run's output overlaps another run's."""
    needs_default = pinned is None and OUTPUT_KEY not in stated.values
    new_run_output = _new_run_output(settings, run) if needs_default else ""  # unused: pinned or stated
    given = resolve(run, pinned=pinned, stated=stated, new_run_output=new_run_output)
    if pinned is not None:
        check_same_settings(pinned, given)
    else:
        _check_output_apart(client, given)
    return given


def _check_fresh_output(url: str, *, allow_location: bool) -> None:
    """A new run's output: not a shared place unless allowed, and new, empty, or holding a run.json."""
    try:
        check_fresh_output(url, ours=(SETTINGS_KEY,), allow_shared=allow_location)
    except UnsupportedStoreUrl as error:
        raise OutputError(f"--output: {error}") from error


def _write_output_settings(store: ObjectStore, settings: RunSettings) -> None:
    """run.json beside the data: proves the output is writable, and no other run's, before anything is
    pinned."""
    try:
        write_run_json(store, settings)
    except OSError as error:
        raise OutputError(f"--output {store.url}: cannot write there: {error}") from error


def cmd_enqueue(args: argparse.Namespace, settings: ProducerSettings) -> int:
    """Validate everything (environment, Redis, settings, input, output), then write run.json, pin the
    settings and enqueue. A refusal leaves nothing pinned and nothing written."""
    run = check_run_name(args.run)
    worker_settings = dataclasses.replace(
        WorkerSettings.from_env(), redis_url=chosen_redis_url(args, settings)
    )
    file_values = read_toml(args.config) if args.config else {}
    stated = _with_output_checked(
        stated_settings(file_values, stated_options(args), file_label=str(args.config))
    )
    check_data(args.data)  # a missing file is said before an unreachable Redis: fix both at once
    client = connect_redis(args, settings)
    existing = pinned_settings(client, run)  # None for a new run
    given = _validated_run(settings, client, run, stated, existing)
    from intake.reading import iter_prompts  # pyarrow, Celery and openai only once the cheap checks passed
    from producer.enqueue.processes import enqueue_in_parts, parts_for
    from producer.enqueue.publisher import BatchPublisher
    from workers.recovery.reconciler import Reconciler, ReconcileSettings
    from workers.state.dispatch import CeleryDispatcher

    limits = ReadLimits(max_row_bytes=args.max_row_bytes or row_limit_bytes(given.sampling.max_tokens))
    prompts = iter_prompts(args.data, turns=given.turns, limits=limits, fields=RowFields.of(given))
    rows = ProgressLines(f"read rows of {args.data}").counted(prompts)
    items = _with_first_prompt(rows, args.data)  # a missing, empty or all-rejected input fails here
    items, given, kept_columns = with_kept_columns(items, given)
    id_sources = IdSources()
    items = id_sources.counted(items)
    items, parts = parts_for(items, args.processes)
    store = checked_output_store(given.output)
    if existing is None:
        _check_fresh_output(given.output, allow_location=args.allow_location)
    _write_output_settings(store, given)
    pinned = pin_settings(client, given)
    started_s = redis_now_s(client)  # batches dispatched before this are the ones a re-run checks

    app = sending_app(worker_settings.broker)
    publisher = BatchPublisher(app)
    try:
        enqueuer = Enqueuer(client, pinned, publisher, source=args.data, store=store)
        if parts == 1:
            report = enqueuer.enqueue(items)
        else:
            report = enqueue_in_parts(
                enqueuer, items, parts, redis_url=worker_settings.redis_url, broker=worker_settings.broker
            )
    finally:
        publisher.close()
    print(f"run {run}: output {pinned.output}")
    _print_enqueue_report(report)
    if parts > 1:
        print(f"processes           {parts} (each classified, claimed and published its share of the ids)")
    _warn_when_most_rows_rejected(report, run)
    if kept_columns is not None and (unkept := kept_columns.unkept_warning()):
        print(f"warning: {unkept}", file=sys.stderr)
    if ids_warning := id_sources.warning():
        print(f"warning: {ids_warning}", file=sys.stderr)
    if report.interrupted:
        print(
            "interrupted: the counts above were enqueued whole (stored, claimed and published); "
            "run the same command again to add the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    # A re-run also sends again every batch of the run that no message carries and nobody leases.
    requeue = ReconcileSettings(upload_max_age_s=worker_settings.upload.max_age_s, stranded_grace_s=0.0)
    stranded = Reconciler(client, CeleryDispatcher(app), requeue).reconcile_run(
        run, dispatched_before_s=started_s
    )
    if stranded.expired_leases or stranded.stranded:
        print(f"requeued            {stranded.expired_leases + stranded.stranded} batches no message carried")
    _say_replicated(client)
    return EXIT_OK


def _say_replicated(client: redis.Redis) -> None:
    """With replicas, the claims on every one of them before enqueue ends (producer/enqueue/replicas.py)."""
    try:
        catch_up = wait_for_replicas(client)
    except ReplicasUnknown as unknown:
        print(f"warning: {unknown}", file=sys.stderr)
        return
    if catch_up is None:
        return
    print(catch_up.line())
    if warning := catch_up.warning():
        print(f"warning: {warning}", file=sys.stderr)
