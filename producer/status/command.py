"""`python -m producer status|pause|resume|rejects`: see a run, stop or restart its generation by hand,
and list in full the rows refused at enqueue and the prompts dead-lettered."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping

import msgspec
import redis
from rich.console import Console
from rich.live import Live

from core.exit_codes import EXIT_FAILED, EXIT_OK
from core.records import DeadLetter, Record, row_place
from intake.rejected import RejectedRow
from intake.rows import rejection_source
from producer.errors import RunNotFound, SettingsError
from producer.run_access import checked_output_store, chosen_redis_url, connect_redis, require_run
from producer.settings import ProducerSettings
from producer.status.gather import gather_status
from producer.status.model import RunStatus
from producer.status.parser import LISTED_KINDS, PRICE_ENV
from producer.status.redis_place import redis_place
from producer.status.view import clock, render_status, status_line
from workers.errors import RecordUnreadable
from workers.record.storage import normalise_output
from workers.state.codec import decode_json
from workers.state.control import PAUSED_BY_USER, PAUSED_RETRY_S, pause, pause_state, resume
from workers.state.keys import RunKeys, check_run_name
from workers.state.record_limits import SMALL_RECORD_LIMIT_BYTES

LIVE_REFRESHES_PER_S = 4
REJECTS_SCAN_COUNT = 1000  # hash fields per HSCAN round trip: a big listing never blocks Redis


def resolve_price(option: float | None, env: Mapping[str, str]) -> tuple[float | None, str]:
    """The price per GPU-hour and where it came from: the option wins over the environment."""
    if option is not None:
        return option, "--price-per-gpu-hour"
    text = env.get(PRICE_ENV)
    if not text:
        return None, "not set"
    try:
        return float(text), f"${PRICE_ENV}"
    except ValueError as error:
        raise SettingsError(f"{PRICE_ENV}={text!r} is not a number of dollars") from error


def cmd_status(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = connect_redis(args, settings)
    run = check_run_name(args.run)
    price, source = resolve_price(args.price_per_gpu_hour, os.environ)

    url = chosen_redis_url(args, settings)

    def snapshot() -> RunStatus:
        status = gather_status(client, run, price_per_gpu_hour=price, price_source=source)
        return msgspec.structs.replace(status, redis=redis_place(url))

    if args.json:
        return _json(snapshot, args.watch)
    console = Console()
    if args.watch is None:
        console.print(render_status(snapshot()))
        return EXIT_OK
    if not console.is_terminal:  # a pipe or a log file: a live view would print nothing until Ctrl-C
        return _lines(snapshot, args.watch)
    try:
        with Live(
            render_status(snapshot()), console=console, refresh_per_second=LIVE_REFRESHES_PER_S, screen=False
        ) as live:
            while True:
                time.sleep(args.watch)
                live.update(render_status(snapshot()))
    except KeyboardInterrupt:
        return EXIT_OK


def _lines(snapshot: Callable[[], RunStatus], watch_s: float) -> int:
    """One line per refresh, flushed at once, until Ctrl-C."""
    try:
        while True:
            sys.stdout.write(status_line(snapshot()) + "\n")
            sys.stdout.flush()
            time.sleep(watch_s)
    except KeyboardInterrupt:
        return EXIT_OK


def _json(snapshot: Callable[[], RunStatus], watch_s: float | None) -> int:
    """One JSON object; with --watch, one per line per refresh (JSON Lines) until Ctrl-C."""
    try:
        while True:
            sys.stdout.write(msgspec.json.encode(snapshot()).decode() + "\n")
            sys.stdout.flush()
            if watch_s is None:
                return EXIT_OK
            time.sleep(watch_s)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_pause(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = connect_redis(args, settings)
    run = check_run_name(args.run)
    require_run(client, run)
    if pause(client, run, args.reason, by=PAUSED_BY_USER):
        print(
            f"run {run} paused: {args.reason}\n"
            "workers take none of its batches from now on; batches already started finish and are kept"
        )
        return EXIT_OK
    state = pause_state(client, run)
    if state is None:  # resumed between the two calls
        print(f"run {run} was resumed meanwhile; pause again", file=sys.stderr)
        return EXIT_FAILED
    print(f"run {run} was already paused by {state.by} at {clock(state.at)}: {state.reason}")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = connect_redis(args, settings)
    run = check_run_name(args.run)
    require_run(client, run)
    state = resume(client, run)
    if state is None:
        print(f"run {run} was not paused")
        return EXIT_OK
    print(
        f"run {run} resumed (it was paused by {state.by} at {clock(state.at)}: {state.reason})\n"
        f"its batches come back within {PAUSED_RETRY_S:.0f} s; the quality gate judges only what comes next"
    )
    return EXIT_OK


class ListedRejection(Record, frozen=True):
    """A row refused at enqueue: the DATA argument it came from, its file and row, and why."""

    source: str
    file: str
    row: int
    reason: str


class RejectsListing(Record, frozen=True):
    run: str
    rejected: list[ListedRejection]
    dead: list[DeadLetter]  # prompt_id, row, reason, error (the server's message), attempts


def _listed(source: str, rejected: RejectedRow) -> ListedRejection:
    return ListedRejection(source=source, file=rejected.file, row=rejected.row, reason=rejected.reason)


def rejects_from_redis(client: redis.Redis, run: str) -> RejectsListing:
    """Every rejected row (the `rejected` hash: field "source|file|row") and every dead letter in Redis."""
    keys = RunKeys(run)
    rejected: list[ListedRejection] = []
    for field, raw in client.hscan_iter(keys.rejected, count=REJECTS_SCAN_COUNT):
        row = msgspec.json.decode(raw, type=RejectedRow)
        rejected.append(_listed(rejection_source(field.decode(), row), row))
    dead = []
    for _, raw in client.hscan_iter(keys.dead, count=REJECTS_SCAN_COUNT):
        with contextlib.suppress(RecordUnreadable):  # the uploader quarantines it if it is pending
            dead.append(decode_json(raw, DeadLetter, limit_bytes=SMALL_RECORD_LIMIT_BYTES))
    return _sorted_listing(run, rejected, dead)


def rejects_from_output(output: str, run: str) -> RejectsListing:
    """The same from the output alone (`rejected/` objects, committed dead letters): Redis may be gone."""
    from workers.record.reading import read_committed, read_rejections

    store = checked_output_store(normalise_output(output))
    rejected = [_listed(stored.source, stored.rejected) for stored in read_rejections(store)]
    return _sorted_listing(run, rejected, list(read_committed(store, completions=False).dead.values()))


def _sorted_listing(run: str, rejected: list[ListedRejection], dead: list[DeadLetter]) -> RejectsListing:
    return RejectsListing(
        run=run,
        rejected=sorted(rejected, key=lambda r: (r.source, r.file, r.row)),
        dead=sorted(dead, key=lambda d: (d.row, d.prompt_id)),
    )


def describe_rejects(listing: RejectsListing, kinds: tuple[str, ...] = LISTED_KINDS) -> list[str]:
    lines = [
        f"run {listing.run}: {len(listing.rejected)} rows rejected at enqueue, "
        f"{len(listing.dead)} prompts dead-lettered"
    ]
    if "rejected" in kinds and listing.rejected:
        lines.append("rejected at enqueue (input, file:row: reason):")
        lines.extend(f"  {r.source} {row_place(r.row, r.file)}: {r.reason}" for r in listing.rejected)
    if "dead" in kinds and listing.dead:
        lines.append("dead-lettered (id, row: reason after attempts: the server's or client's message):")
        lines.extend(
            f"  {d.prompt_id} ({row_place(d.row, d.file)}): {d.reason} after {d.attempts} "
            f"attempt{'' if d.attempts == 1 else 's'}: {d.error}"
            for d in listing.dead
        )
    return lines


def cmd_rejects(args: argparse.Namespace, settings: ProducerSettings) -> int:
    run = check_run_name(args.run)
    if args.output is not None:
        listing = rejects_from_output(args.output, run)
    else:
        client = connect_redis(args, settings)
        if not client.exists(RunKeys(run).settings):
            raise RunNotFound(f"no run named {run!r} in Redis: name its output with --output to read it")
        listing = rejects_from_redis(client, run)
    kinds = LISTED_KINDS if args.only is None else (args.only,)
    if args.json:
        chosen = {kind: getattr(listing, kind) for kind in kinds}
        sys.stdout.write(msgspec.json.encode({"run": run, **chosen}).decode() + "\n")
        return EXIT_OK
    for line in describe_rejects(listing, kinds):
        print(line)
    return EXIT_OK
