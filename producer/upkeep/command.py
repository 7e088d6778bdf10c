"""The commands of `python -m producer` that read a run: verify, recover, files and gc, and
load-functions (enqueue's own handler is producer/enqueue/command.py; what every command shares is
producer/run_access.py).

Imported only when one of them runs (see producer/deferred.py); only reading a part imports the Parquet
readers (workers/record/reading.py), so `files` and `gc` start without pyarrow.
"""

from __future__ import annotations

import argparse

from core.exit_codes import EXIT_FAILED, EXIT_OK
from intake.data_files import check_data
from producer.progress_lines import ProgressLines
from producer.run_access import checked_output_store, connect_redis, require_run
from producer.settings import ProducerSettings
from producer.upkeep.gc import collect_orphans
from producer.upkeep.recover import read_run_settings, recover_run
from producer.upkeep.verify import describe, verify_run
from workers.record.manifest import committed_locations
from workers.record.storage import normalise_output, open_store
from workers.state.keys import check_run_name
from workers.state.protocol import LIBRARY


def cmd_verify(args: argparse.Namespace, settings: ProducerSettings) -> int:

    run = check_run_name(args.run)
    if args.output is not None:  # the object store alone
        store = checked_output_store(normalise_output(args.output))
        read_run_settings(store, run)  # an output of another run is refused
        report = verify_run(store, run, on_entry=ProgressLines("verified manifest entries").update)
    else:
        client = connect_redis(args, settings)
        store = open_store(require_run(client, run).output)
        report = verify_run(store, run, client, on_entry=ProgressLines("verified manifest entries").update)
    print(f"run {run}: {store.url}")
    for line in describe(report):
        print(line)
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_recover(args: argparse.Namespace, settings: ProducerSettings) -> int:
    """Rebuild the run's Redis state from its output; with --requeue, enqueue its data again, as
    `enqueue DATA --run RUN` would: one command after Redis was lost altogether."""
    run = check_run_name(args.run)
    for data in args.requeue:  # a missing input is said before anything is written
        check_data(data)
    store = checked_output_store(normalise_output(args.output))
    client = connect_redis(args, settings)
    report = recover_run(client, store, run)
    restored = "restored from run.json" if report.settings_restored else "already pinned, the same"
    print(f"run {args.run}: settings {restored}")
    print(f"committed           {report.committed} prompts in {report.parts} parts")
    print(f"newly marked done   {report.newly_marked_done}")
    print(f"enqueued ids        {report.enqueued}")
    print(f"fingerprints        {report.fingerprints} (explicit ids: a changed row is told from a duplicate)")
    print(f"dead letters        {report.dead_letters}")
    print(f"rejected rows       {report.rejected_rows}")
    if not args.requeue:
        print(
            "Re-run `enqueue` with the run's data (or this command with --requeue DATA): it queues only what "
            "was never committed."
        )
        return EXIT_OK
    for data in args.requeue:
        print(f"enqueue {data} again, into run {run}:")
        code = enqueue_again(args, settings, run, data)
        if code != EXIT_OK:
            return code
    return EXIT_OK


def enqueue_again(args: argparse.Namespace, settings: ProducerSettings, run: str, data: str) -> int:
    """`enqueue DATA --run RUN` with the run's pinned settings, through the same command and checks."""
    from producer.cli import build_parser  # the whole command line only when it is needed
    from producer.enqueue.command import cmd_enqueue

    redis_url = ["--redis-url", args.redis_url] if args.redis_url else []
    return cmd_enqueue(build_parser().parse_args([*redis_url, "enqueue", data, "--run", run]), settings)


def cmd_files(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = connect_redis(args, settings)
    pinned = require_run(client, check_run_name(args.run))
    for location in committed_locations(pinned.output):
        print(location)
    return EXIT_OK


def cmd_gc(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = connect_redis(args, settings)
    pinned = require_run(client, check_run_name(args.run))
    report = collect_orphans(open_store(pinned.output), dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(report.removed)} orphans ({report.bytes_removed} bytes)")
    for key in report.removed:
        print(f"  {key}")
    if report.kept_uncommitted:
        print(
            f"kept {len(report.kept_uncommitted)} objects of parts not committed yet "
            "(a flush may still commit them)"
        )
    return EXIT_OK


def cmd_load_functions(args: argparse.Namespace, settings: ProducerSettings) -> int:
    loaded = LIBRARY.load(connect_redis(args, settings))
    print(f"{LIBRARY.name}: {'loaded' if loaded else 'already loaded'}")
    return EXIT_OK
