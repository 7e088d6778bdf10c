"""`python -m producer <command>`: enqueue prompts into a run, verify its output, remove orphans."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import msgspec
import redis

from inference.records import Prompt
from inference.sampling_options import SAMPLING_OPTION_NAMES, add_sampling_options
from producer.enqueue import Enqueuer, EnqueueReport, check_same_settings, pin_settings
from producer.errors import (
    OutputError,
    ProducerError,
    RunNotFound,
    RunStateBroken,
    SettingsError,
    SourceError,
)
from producer.gc import DEFAULT_MIN_ORPHAN_AGE_S, collect_orphans
from producer.reading import iter_prompts
from producer.recover import check_output_belongs_to, read_run_settings, recover_run, write_run_settings
from producer.rows import RejectedRow
from producer.run_config import read_toml, resolve_run_settings
from producer.settings import REDIS_URL_ENV, ProducerSettings
from producer.verify import describe, verify_run
from workers.keys import InvalidRunName, RunKeys, check_run_name
from workers.manifest import committed_locations
from workers.runs import RunSettings, TruncationPolicy, decode_run_settings
from workers.settings import DEFAULT_REDIS_URL, InvalidSetting, WorkerSettings
from workers.storage import (
    ObjectStore,
    StoreUnavailable,
    UnsafeKey,
    UnsupportedStoreUrl,
    check_output_folder,
    normalise_output_url,
    open_store,
)

# More sub-commands: each module exposes `register(subparsers)`, adding parsers whose `handler`
# takes (args, ProducerSettings) and returns an exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "producer.demo",
    "producer.export_cli",
    "producer.report_cli",
    "producer.status_cli",
)

EXIT_OK = 0
EXIT_FAILED = 1  # a failure: see producer/errors.py for which ones a retry fixes
EXIT_USAGE = 2  # the command, an option, the input or the environment must change (argparse uses 2 too)
EXIT_INTERRUPTED = 128 + signal.SIGINT  # Ctrl-C, as a shell reports it
S3_HINT = " (check the AWS credentials, region, bucket and AWS_ENDPOINT_URL)"

HELP_EPILOG = """examples:
  python -m producer enqueue prompts.jsonl --run qwen-think-v1 --max-tokens 32768 --output s3://bucket/runs
  python -m producer enqueue s3://bucket/data/train.parquet --run qwen-think-v1   # again: adds only new
  python -m producer verify --run qwen-think-v1
  python -m producer gc --run qwen-think-v1 --dry-run
  python -m producer recover --run qwen-think-v1 --output s3://bucket/runs   # after losing Redis
  python -c "import pandas as pd, sys; print(pd.concat(map(pd.read_parquet, sys.argv[1:])))" \
      $(python -m producer files --run qwen-think-v1)
"""


def _add_sampling_options(parser: argparse.ArgumentParser) -> None:
    group = add_sampling_options(
        parser,
        title="generation settings (pinned at the run's first enqueue)",
        thinking_help="chat_template_kwargs.enable_thinking (default on)",
        seed_help="recorded; SGLang honours it only with deterministic inference",
    )
    group.add_argument("--batch-size", dest="batch_size", type=int, help="prompts per message (default 32)")
    group.add_argument(
        "--output", dest="output_url", help="s3://bucket/prefix or a folder (default ./output)"
    )
    quality = parser.add_argument_group("data quality (pinned too)")
    quality.add_argument(
        "--truncated-thinking",
        dest="truncated_thinking",
        choices=[policy.value for policy in TruncationPolicy],
        help="completions whose thinking hit max_tokens: keep (default), drop (dead-letter), "
        "or retry with double the budget up to --retry-max-tokens-cap",
    )
    quality.add_argument("--retry-max-tokens-cap", dest="retry_max_tokens_cap", type=int)
    quality.add_argument(
        "--gate-min-completions",
        dest="gate_min_completions",
        type=int,
        help="judge after this many (default 200)",
    )
    quality.add_argument(
        "--gate-max-empty-rate",
        dest="gate_max_empty_answer_rate",
        type=float,
        help="pause above (default 0.2)",
    )
    quality.add_argument(
        "--gate-max-truncated-rate",
        dest="gate_max_truncated_rate",
        type=float,
        help="pause above (default 0.3)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m producer",
        description=__doc__,
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--redis-url", help="default: $DRAFTGEN_REDIS_URL or redis://127.0.0.1:6379/0")
    commands = parser.add_subparsers(dest="command", required=True)

    enqueue = commands.add_parser("enqueue", help="add a dataset's prompts to a run (only what is new)")
    enqueue.add_argument("data", help="JSONL/Parquet file or folder, s3://bucket/key, or a datasets folder")
    enqueue.add_argument("--run", required=True, help="the run's name")
    _add_sampling_options(enqueue)
    enqueue.set_defaults(handler=cmd_enqueue)

    verify = commands.add_parser(
        "verify", help="check every prompt is committed exactly once or dead-lettered"
    )
    verify.add_argument("--run", required=True)
    verify.add_argument(
        "--output",
        dest="output_url",
        default=None,
        help="prove it from this output (folder or s3://) alone, without Redis",
    )
    verify.set_defaults(handler=cmd_verify)

    gc = commands.add_parser("gc", help="remove objects no manifest entry names")
    gc.add_argument("--run", required=True)
    gc.add_argument(
        "--min-age-s",
        type=float,
        default=DEFAULT_MIN_ORPHAN_AGE_S,
        help="leave younger orphans alone: a flush may be mid-commit (default 3600)",
    )
    gc.add_argument("--dry-run", action="store_true")
    gc.set_defaults(handler=cmd_gc)
    recover = commands.add_parser(
        "recover", help="rebuild a run's Redis state from its output after losing Redis"
    )
    recover.add_argument("--run", required=True)
    recover.add_argument(
        "--output", dest="output_url", required=True, help="the run's s3://bucket/prefix or folder"
    )
    recover.set_defaults(handler=cmd_recover)

    files = commands.add_parser(
        "files", help="list the committed objects (the only ones to read), one per line"
    )
    files.add_argument("--run", required=True)
    files.set_defaults(handler=cmd_files)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(commands)
    return parser


def _redis_url(args: argparse.Namespace, settings: ProducerSettings) -> str:
    url: str = args.redis_url or settings.redis_url
    return url


def _redis(args: argparse.Namespace, settings: ProducerSettings) -> redis.Redis:
    """A client whose Redis answered: a wrong URL or password fails here, before anything is done."""
    client = redis.Redis.from_url(_redis_url(args, settings))
    client.ping()
    return client


def _pinned(client: redis.Redis, run: str) -> RunSettings | None:
    raw = client.get(RunKeys(run).settings)
    if raw is None:
        return None
    try:
        return decode_run_settings(raw)
    except msgspec.DecodeError as error:
        raise RunStateBroken(
            f"run {run!r}: its pinned settings in Redis are unreadable ({error}); `python -m producer "
            f"recover --run {run} --output URL` restores them from the output's run.json"
        ) from error


def _require_run(client: redis.Redis, run: str) -> RunSettings:
    pinned = _pinned(client, run)
    if pinned is None:
        raise RunNotFound(
            f"no run named {run!r} in Redis: start it with `python -m producer enqueue DATA --run {run}`"
        )
    return pinned


def _output_store(url: str) -> ObjectStore:
    """The store of a normalised output URL, refused before anything is written when a folder cannot be."""
    try:
        check_output_folder(url)
    except UnsupportedStoreUrl as error:
        raise OutputError(f"--output: {error}") from error
    return open_store(url)


def _print_enqueue_report(report: EnqueueReport) -> None:
    print(f"new                 {report.new} prompts in {report.batches} batches")
    print(f"already there       {report.already_there}")
    if report.requeued_orphans:
        print(f"requeued            {report.requeued_orphans} (held by the run, by no batch: after recover)")
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


def _with_first_row(items: Iterator[Prompt | RejectedRow], data: str) -> Iterator[Prompt | RejectedRow]:
    """The same stream, refused (SourceError) when it holds no row at all: a run of nothing is a mistake."""
    first = next(items, None)
    if first is None:
        raise SourceError(f"{data}: holds no rows (empty, or only blank lines): nothing to enqueue")
    return itertools.chain([first], items)


def _enqueue_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        name: getattr(args, name)
        for name in (
            *SAMPLING_OPTION_NAMES,
            "batch_size",
            "output_url",
            "truncated_thinking",
            "retry_max_tokens_cap",
            "gate_min_completions",
            "gate_max_empty_answer_rate",
            "gate_max_truncated_rate",
        )
    }


def _validated_run(
    args: argparse.Namespace, settings: ProducerSettings, client: redis.Redis, run: str
) -> RunSettings:
    """The run's settings, every value checked, and refused when they differ from the pinned ones."""
    pinned = _pinned(client, run)
    given = resolve_run_settings(
        run,
        pinned=pinned,
        file_values=read_toml(args.config) if args.config else {},
        option_values=_enqueue_options(args),
        default_output=settings.default_output,
        file_label=str(args.config),
    )
    if pinned is not None:
        check_same_settings(pinned, given)
    return given


def _write_output_settings(store: ObjectStore, settings: RunSettings) -> None:
    """run.json beside the data: proves the output is writable before anything is pinned."""
    try:
        write_run_settings(store, settings)
    except OSError as error:
        raise OutputError(f"--output {store.url}: cannot write there: {error}") from error


def cmd_enqueue(args: argparse.Namespace, settings: ProducerSettings) -> int:
    """Validate everything (environment, Redis, settings, input, output), then write run.json, pin the
    settings and enqueue. A refusal leaves nothing pinned and nothing written."""
    from producer.publisher import BatchPublisher  # Celery only where messages are sent
    from workers.app import make_app
    from workers.dispatch import CeleryDispatcher
    from workers.reconciler import Reconciler, ReconcileSettings

    run = check_run_name(args.run)
    worker_settings = dataclasses.replace(WorkerSettings.from_env(), redis_url=_redis_url(args, settings))
    client = _redis(args, settings)
    given = _validated_run(args, settings, client, run)
    items = _with_first_row(iter_prompts(args.data), args.data)  # a missing or empty input fails here
    store = _output_store(given.output_url)
    check_output_belongs_to(store, run)
    _write_output_settings(store, given)
    pinned = pin_settings(client, given)

    app = make_app(worker_settings)
    publisher = BatchPublisher(app)
    try:
        report = Enqueuer(client, pinned, publisher, source=args.data, store=store).enqueue(items)
    finally:
        publisher.close()
    print(f"run {run}: output {pinned.output_url}")
    _print_enqueue_report(report)
    if report.interrupted:
        print(
            "interrupted: the counts above were enqueued whole (stored, claimed and published); "
            "run the same command again to add the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    # A re-run also sends again every batch of the run that no message carries and nobody leases.
    requeue = ReconcileSettings(upload_max_age_s=worker_settings.upload.max_age_s, stranded_grace_s=0.0)
    stranded = Reconciler(client, CeleryDispatcher(app), requeue).reconcile_run(run)
    if stranded.expired_leases or stranded.stranded:
        print(f"requeued            {stranded.expired_leases + stranded.stranded} batches no message carried")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, settings: ProducerSettings) -> int:
    run = check_run_name(args.run)
    if args.output_url is not None:  # the object store alone
        store = _output_store(normalise_output_url(args.output_url))
        if read_run_settings(store).run != run:
            raise SettingsError(f"{store.url} holds the output of another run than {run!r}")
        report = verify_run(store, run)
    else:
        client = _redis(args, settings)
        store = open_store(_require_run(client, run).output_url)
        report = verify_run(store, run, client)
    print(f"run {run}: {store.url}")
    for line in describe(report):
        print(line)
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_recover(args: argparse.Namespace, settings: ProducerSettings) -> int:
    run = check_run_name(args.run)
    store = _output_store(normalise_output_url(args.output_url))
    client = _redis(args, settings)
    report = recover_run(client, store, run)
    restored = "restored from run.json" if report.settings_restored else "already pinned, the same"
    print(f"run {args.run}: settings {restored}")
    print(f"committed           {report.committed} prompts in {report.parts} parts")
    print(f"newly marked done   {report.newly_marked_done}")
    print(f"enqueued ids        {report.enqueued}")
    print(f"dead letters        {report.dead_letters}")
    print(f"rejected rows       {report.rejected_rows}")
    print("Re-run `enqueue` with the run's data: it queues only what was never committed.")
    return EXIT_OK


def cmd_files(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = _redis(args, settings)
    pinned = _require_run(client, check_run_name(args.run))
    for location in committed_locations(pinned.output_url):
        print(location)
    return EXIT_OK


def cmd_gc(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = _redis(args, settings)
    pinned = _require_run(client, check_run_name(args.run))
    report = collect_orphans(open_store(pinned.output_url), min_age_s=args.min_age_s, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(report.removed)} orphans ({report.bytes_removed} bytes)")
    for key in report.removed:
        print(f"  {key}")
    if report.kept_young:
        print(f"kept {len(report.kept_young)} orphans younger than {args.min_age_s:.0f} s (maybe mid-commit)")
    return EXIT_OK


def _redis_where(args: argparse.Namespace) -> str:
    """Where Redis was looked for, without a password."""
    url = str(getattr(args, "redis_url", None) or os.environ.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL)
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


def _fail(message: str, exit_code: int, *, retry_helps: bool = False) -> int:
    print(f"error: {message}", file=sys.stderr)
    if retry_helps:
        print("a retry helps: run the same command again once that is fixed", file=sys.stderr)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every refusal is one or two lines on stderr and an exit code: EXIT_USAGE for
    what the user must change, EXIT_FAILED for a failure (see producer/errors.py), never a traceback."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        exit_code: int = args.handler(args, ProducerSettings.from_env())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ProducerError as error:
        return _fail(str(error), error.exit_code, retry_helps=error.retry_helps)
    except (InvalidRunName, UnsupportedStoreUrl, UnsafeKey, InvalidSetting) as error:  # --run, --output, env
        return _fail(str(error), EXIT_USAGE)
    except redis.RedisError as error:
        return _fail(f"Redis at {_redis_where(args)}: {error}", EXIT_FAILED, retry_helps=True)
    except StoreUnavailable as error:
        return _fail(f"{error}{S3_HINT if 's3://' in str(error) else ''}", EXIT_FAILED, retry_helps=True)
    return exit_code
