"""`python -m producer status|pause|resume`: see a run, and stop or restart its generation by hand."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import redis
from rich.console import Console
from rich.live import Live

from producer import metrics_exporter
from producer.errors import RedisUnavailable, SettingsError
from producer.settings import ProducerSettings
from producer.status.gather import gather_status, load_settings
from producer.status.model import RunStatus
from producer.status_view import clock, render_status
from workers.batches import PAUSED_RETRY_S
from workers.control import PAUSED_BY_USER, pause, pause_state, resume
from workers.keys import check_run_name

PRICE_ENV = "DRAFTGEN_PRICE_PER_GPU_HOUR"
DEFAULT_WATCH_INTERVAL_S = 2.0
DEFAULT_PAUSE_REASON = "paused by hand"
EXIT_OK = 0
EXIT_FAILED = 1
LIVE_REFRESHES_PER_S = 4

Handler = Callable[[argparse.Namespace, ProducerSettings], int]


def _redis(args: argparse.Namespace, settings: ProducerSettings) -> redis.Redis:
    return redis.Redis.from_url(args.redis_url or settings.redis_url)


def _redis_errors_reported(handler: Handler) -> Handler:
    """A Redis failure ends the command with one line naming it, not a traceback."""

    @functools.wraps(handler)
    def guarded(args: argparse.Namespace, settings: ProducerSettings) -> int:
        try:
            return handler(args, settings)
        except redis.RedisError as error:
            url = args.redis_url or settings.redis_url
            raise RedisUnavailable(f"Redis at {url.rpartition('@')[2]}: {error}") from error

    return guarded


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


@_redis_errors_reported
def cmd_status(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = _redis(args, settings)
    run = check_run_name(args.run)
    price, source = resolve_price(args.price_per_gpu_hour, os.environ)

    def snapshot() -> RunStatus:
        return gather_status(client, run, price_per_gpu_hour=price, price_source=source)

    if args.json:
        return _json(snapshot, args.watch)
    console = Console()
    if args.watch is None:
        console.print(render_status(snapshot()))
        return EXIT_OK
    try:
        with Live(
            render_status(snapshot()), console=console, refresh_per_second=LIVE_REFRESHES_PER_S, screen=False
        ) as live:
            while True:
                time.sleep(args.watch)
                live.update(render_status(snapshot()))
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


@_redis_errors_reported
def cmd_pause(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = _redis(args, settings)
    run = check_run_name(args.run)
    load_settings(client, run)  # the run must exist
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


@_redis_errors_reported
def cmd_resume(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = _redis(args, settings)
    run = check_run_name(args.run)
    load_settings(client, run)
    state = resume(client, run)
    if state is None:
        print(f"run {run} was not paused")
        return EXIT_OK
    print(
        f"run {run} resumed (it was paused by {state.by} at {clock(state.at)}: {state.reason})\n"
        f"its batches come back within {PAUSED_RETRY_S:.0f} s; the quality gate judges only what comes next"
    )
    return EXIT_OK


def register(commands: Any) -> None:
    """Add `status`, `pause`, `resume` and `metrics` to the `python -m producer` sub-commands."""
    metrics_exporter.register(commands)
    status = commands.add_parser(
        "status", help="progress, rates, ETA, cost, GPUs, queues, quality and pause state of a run"
    )
    status.add_argument("--run", required=True)
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=DEFAULT_WATCH_INTERVAL_S,
        default=None,
        metavar="SECONDS",
        help=f"refresh every SECONDS (default {DEFAULT_WATCH_INTERVAL_S:.0f}) until Ctrl-C",
    )
    status.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    status.add_argument(
        "--price-per-gpu-hour",
        type=float,
        metavar="USD",
        help=f"for the cost figures (default ${PRICE_ENV}; without either, cost is shown in GPU-hours only)",
    )
    status.set_defaults(handler=cmd_status)

    pause_parser = commands.add_parser("pause", help="stop workers taking a run's batches (nothing is lost)")
    pause_parser.add_argument("--run", required=True)
    pause_parser.add_argument("--reason", default=DEFAULT_PAUSE_REASON, help="shown by status")
    pause_parser.set_defaults(handler=cmd_pause)

    resume_parser = commands.add_parser("resume", help="let workers take a paused run's batches again")
    resume_parser.add_argument("--run", required=True)
    resume_parser.set_defaults(handler=cmd_resume)
