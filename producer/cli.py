"""`python -m producer <command>`: enqueue prompts into a run, verify its output, remove orphans."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys
from typing import Any

import redis

from inference.sampling_options import SAMPLING_OPTION_NAMES, add_sampling_options
from producer.enqueue import Enqueuer, EnqueueReport, pin_settings
from producer.errors import ProducerError, RunNotFound, SettingsError
from producer.gc import DEFAULT_MIN_ORPHAN_AGE_S, collect_orphans
from producer.reading import iter_prompts
from producer.recover import check_output_belongs_to, read_run_settings, recover_run, write_run_settings
from producer.run_config import read_toml, resolve_run_settings
from producer.settings import ProducerSettings
from producer.verify import describe, verify_run
from workers.keys import InvalidRunName, RunKeys, check_run_name
from workers.manifest import committed_locations
from workers.runs import RunSettings, TruncationPolicy, decode_run_settings
from workers.settings import WorkerSettings
from workers.storage import UnsafeKey, UnsupportedStoreUrl, normalise_output_url, open_store

# More sub-commands: each module exposes `register(subparsers)`, adding parsers whose `handler`
# takes (args, ProducerSettings) and returns an exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "producer.demo",
    "producer.export_cli",
    "producer.report_cli",
    "producer.status_cli",
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

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
    return redis.Redis.from_url(_redis_url(args, settings))


def _pinned(client: redis.Redis, run: str) -> RunSettings | None:
    raw = client.get(RunKeys(run).settings)
    return decode_run_settings(raw) if raw is not None else None


def _require_run(client: redis.Redis, run: str) -> RunSettings:
    pinned = _pinned(client, run)
    if pinned is None:
        raise RunNotFound(
            f"no run named {run!r} in Redis: start it with `python -m producer enqueue DATA --run {run}`"
        )
    return pinned


def _print_enqueue_report(report: EnqueueReport) -> None:
    print(f"new                 {report.new} prompts in {report.batches} batches")
    print(f"already there       {report.already_there}")
    if report.requeued_orphans:
        print(f"requeued            {report.requeued_orphans} (held by the run, by no batch: after recover)")
    print(f"duplicate ids       {report.duplicates_in_input} (in the input; kept the first)")
    print(f"rejected rows       {report.rejected_count}")
    for rejected in report.rejected:
        print(f"  {rejected.describe()}")
    if report.rejected_count > len(report.rejected):
        print(f"  … {report.rejected_count - len(report.rejected)} more (all are kept in Redis for `status`)")
    if report.republished_batches:
        print(f"republished         {report.republished_batches} batches a previous enqueue left unpublished")


def cmd_enqueue(args: argparse.Namespace, settings: ProducerSettings) -> int:
    from producer.publisher import BatchPublisher  # Celery only where messages are sent
    from workers.app import make_app
    from workers.dispatch import CeleryDispatcher
    from workers.reconciler import Reconciler, ReconcileSettings

    run = check_run_name(args.run)
    client = _redis(args, settings)
    options: dict[str, Any] = {
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
    file_values = read_toml(args.config) if args.config else {}
    given = resolve_run_settings(
        run,
        pinned=_pinned(client, run),
        file_values=file_values,
        option_values=options,
        default_output=settings.default_output,
    )
    items = iter_prompts(args.data)  # opens the source now: a missing file fails before anything is pinned
    check_output_belongs_to(open_store(given.output_url), run)  # before anything is pinned
    pinned = pin_settings(client, given)
    store = open_store(pinned.output_url)
    write_run_settings(store, pinned)  # also proves the output is writable, now

    worker_settings = dataclasses.replace(WorkerSettings.from_env(), redis_url=_redis_url(args, settings))
    app = make_app(worker_settings)
    publisher = BatchPublisher(app)
    try:
        report = Enqueuer(client, pinned, publisher, source=args.data, store=store).enqueue(items)
    finally:
        publisher.close()
    # A re-run also sends again every batch of the run that no message carries and nobody leases.
    requeue = ReconcileSettings(upload_max_age_s=worker_settings.upload.max_age_s, stranded_grace_s=0.0)
    stranded = Reconciler(client, CeleryDispatcher(app), requeue).reconcile_run(run)
    print(f"run {run}: output {pinned.output_url}")
    _print_enqueue_report(report)
    if stranded.expired_leases or stranded.stranded:
        print(f"requeued            {stranded.expired_leases + stranded.stranded} batches no message carried")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, settings: ProducerSettings) -> int:
    run = check_run_name(args.run)
    if args.output_url is not None:  # the object store alone
        store = open_store(normalise_output_url(args.output_url))
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
    client = _redis(args, settings)
    store = open_store(normalise_output_url(args.output_url))
    report = recover_run(client, store, check_run_name(args.run))
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


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        exit_code: int = args.handler(args, ProducerSettings.from_env())
    except ProducerError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (InvalidRunName, UnsupportedStoreUrl, UnsafeKey) as error:  # a bad --run, --output or manifest
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return exit_code
