"""`python -m producer runs`: every run Redis knows, a line each with its state, progress and output."""

from __future__ import annotations

import argparse
import os
import sys

import msgspec
import redis

from core.exit_codes import EXIT_OK
from core.records import Record
from producer.errors import RunStateBroken
from producer.run_access import connect_redis, run_names
from producer.settings import ProducerSettings
from producer.status.command import resolve_price
from producer.status.gather import gather_status
from producer.status.view import percent

STATE_UNREADABLE = "unreadable"


class RunLine(Record, frozen=True):
    run: str
    state: str  # status's state; `unreadable` when its settings in Redis are not a run's
    enqueued: int = 0
    committed: int = 0
    dead_lettered: int = 0
    paused_by: str | None = None
    output: str = ""
    problem: str = ""  # why the run cannot be read


def run_line(client: redis.Redis, run: str, price: float | None, source: str) -> RunLine:
    try:
        status = gather_status(client, run, price_per_gpu_hour=price, price_source=source)
    except RunStateBroken as error:
        return RunLine(run=run, state=STATE_UNREADABLE, problem=str(error))
    progress = status.progress
    return RunLine(
        run=run,
        state=status.state,
        enqueued=progress.enqueued,
        committed=progress.committed,
        dead_lettered=progress.dead_lettered,
        paused_by=status.paused.by if status.paused else None,
        output=status.output,
    )


def render_runs(lines: list[RunLine]) -> str:
    """Aligned columns, one run a line: what a person reads and `awk` splits (the output last)."""
    table = [("RUN", "STATE", "COMMITTED", "DEAD", "OUTPUT")]
    for line in lines:
        state = line.state if line.paused_by is None else f"{line.state} ({line.paused_by})"
        share = percent(line.committed / line.enqueued) if line.enqueued else "-"
        committed = f"{line.committed:,}/{line.enqueued:,} {share}"
        table.append((line.run, state, committed, f"{line.dead_lettered:,}", line.output or line.problem))
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in table
    )


def cmd_runs(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = connect_redis(args, settings)
    price, source = resolve_price(None, os.environ)
    lines = [run_line(client, run, price, source) for run in run_names(client)]
    if args.json:
        sys.stdout.write(msgspec.json.encode(lines).decode() + "\n")
    elif not lines:
        print("Redis knows no run yet: start one with `python -m producer enqueue DATA --run NAME`")
    else:
        print(render_runs(lines))
    return EXIT_OK
