"""`python -m producer wait --run NAME`: block until the run ends, and say how by the exit code, so that
`python -m producer wait --run r && python -m producer export --run r ...` can be scripted.

A run ends when every prompt is in its output (`finished`: exit 0, or EXIT_FINISHED_WITH_DEAD_LETTERS when
some are there as dead letters) or when it is paused (EXIT_PAUSED_BY_GATE when the quality gate paused it,
EXIT_PAUSED by hand or by the uploader). A paused run is an ending too: nothing more comes of it until
someone resumes it. --timeout gives up with EXIT_TIMED_OUT.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.exit_codes import (
    EXIT_FINISHED_WITH_DEAD_LETTERS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PAUSED,
    EXIT_PAUSED_BY_GATE,
    EXIT_TIMED_OUT,
)
from producer.run_access import connect_redis, require_run
from producer.settings import ProducerSettings
from producer.status.figures import STATE_FINISHED
from producer.status.model import RunStatus
from producer.status.view import duration, status_line
from workers.state.control import PAUSED_BY_GATE
from workers.state.keys import check_run_name

REPORT_EVERY_S = 60.0  # a status line at least this often while the state stays the same


@dataclass(frozen=True)
class Ending:
    exit_code: int
    verdict: str


def ending_of(status: RunStatus) -> Ending | None:
    """How the run has ended, or None while it goes on."""
    run, progress = status.run, status.progress
    if status.paused is not None:
        by_gate = status.paused.by == PAUSED_BY_GATE
        return Ending(
            EXIT_PAUSED_BY_GATE if by_gate else EXIT_PAUSED,
            f"run {run} is paused by {'the quality gate' if by_gate else status.paused.by}: "
            f"{status.paused.reason}; `python -m producer status --run {run}` shows it, "
            f"`python -m producer resume --run {run}` goes on",
        )
    if status.state != STATE_FINISHED:
        return None
    if progress.dead_lettered:
        return Ending(
            EXIT_FINISHED_WITH_DEAD_LETTERS,
            f"run {run} finished: {progress.committed:,} of {progress.enqueued:,} prompts committed, "
            f"{progress.dead_lettered:,} dead-lettered: `python -m producer rejects --run {run} --only dead`",
        )
    return Ending(EXIT_OK, f"run {run} finished: all {progress.committed:,} prompts committed")


@dataclass(frozen=True)
class WaitClock:
    """What waiting needs of time: a monotonic clock and a sleep (a test gives its own)."""

    now_s: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def wait_for_run(
    snapshot: Callable[[], RunStatus],
    *,
    interval_s: float,
    timeout_s: float | None,
    report: Callable[[str], None],
    clock: WaitClock,
) -> Ending:
    """Poll the run until it ends or `timeout_s` passes, reporting a status line at each change of state
    and at least every REPORT_EVERY_S."""
    started_s = clock.now_s()
    reported: tuple[str, float] | None = None  # the state last reported, and when
    while True:
        status = snapshot()
        ending = ending_of(status)
        now_s = clock.now_s()
        if reported is None or reported[0] != status.state or now_s - reported[1] >= REPORT_EVERY_S:
            report(status_line(status))
            reported = (status.state, now_s)
        if ending is not None:
            return ending
        if timeout_s is not None and now_s - started_s >= timeout_s:
            return Ending(
                EXIT_TIMED_OUT,
                f"run {status.run} is still {status.state} after {duration(timeout_s)}: "
                f"{status.progress.committed:,} of {status.progress.enqueued:,} prompts committed",
            )
        clock.sleep(interval_s)


def cmd_wait(args: argparse.Namespace, settings: ProducerSettings) -> int:
    from producer.status.command import resolve_price
    from producer.status.gather import gather_status

    client = connect_redis(args, settings)
    run = check_run_name(args.run)
    require_run(client, run)
    price, source = resolve_price(None, os.environ)

    def report(line: str) -> None:
        print(line, flush=True)

    try:
        ending = wait_for_run(
            lambda: gather_status(client, run, price_per_gpu_hour=price, price_source=source),
            interval_s=args.interval,
            timeout_s=args.timeout,
            report=report,
            clock=WaitClock(),
        )
    except KeyboardInterrupt:
        print(f"stopped waiting for run {run}; the run goes on", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(ending.verdict, file=sys.stdout if ending.exit_code == EXIT_OK else sys.stderr)
    return ending.exit_code
