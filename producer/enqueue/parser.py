"""The parser of `python -m producer enqueue`: the input, the run, and every setting a run pins."""

from __future__ import annotations

import argparse
from typing import Any

from core.run_settings.options import add_run_options
from producer.deferred import Deferred
from producer.settings import MAX_ENQUEUE_PROCESSES, PROCESSES_MIN_ROWS
from workers.record.output_places import ALLOW_LOCATION_FLAG


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value


def _enqueue_processes(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_ENQUEUE_PROCESSES:
        raise argparse.ArgumentTypeError(
            f"{value} is more than {MAX_ENQUEUE_PROCESSES} (each holds its own Redis and broker connections)"
        )
    return value


def register(commands: Any) -> None:
    """Add the `enqueue` command to `python -m producer`."""
    enqueue = commands.add_parser("enqueue", help="add a dataset's prompts to a run (only what is new)")
    enqueue.add_argument("data", help="JSONL/Parquet file or folder, s3://bucket/key, or a datasets folder")
    enqueue.add_argument("--run", required=True, help="the run's name")
    enqueue.add_argument(
        "--max-row-bytes",
        dest="max_row_bytes",
        type=_positive_int,
        help="reject rows longer than this (default: what the longest context leaves beside max_tokens, "
        "8 bytes a token: 8 MB at 32768); not pinned",
    )
    enqueue.add_argument(
        "--processes",
        type=_enqueue_processes,
        help="processes that classify, claim and publish, each on its own ids (default: one per core once "
        f"the input holds over {PROCESSES_MIN_ROWS:,} rows, at most {MAX_ENQUEUE_PROCESSES}); not pinned",
    )
    add_run_options(enqueue)
    enqueue.add_argument(
        ALLOW_LOCATION_FLAG,
        dest="allow_location",
        action="store_true",
        help="a new run's output may be under /var, /opt or /srv, in a home folder itself or a hidden "
        "folder of one (refused by default)",
    )
    enqueue.set_defaults(handler=Deferred("producer.enqueue.command", "cmd_enqueue"))
