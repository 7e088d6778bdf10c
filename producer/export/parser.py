"""`python -m producer export`: a run's committed completions as the JSONL a drafter trainer reads.

Reads only the run's output (the manifest and the objects it names), never Redis, so it works after
the fleet is gone; `--output` names the run's output (without it, Redis is asked where it is).
Re-running an interrupted export finishes it with the same files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from core.records import Quality
from producer.deferred import Deferred
from producer.errors import SettingsError
from producer.export.formats import ExportFormat, ThinkingStyle
from producer.export.loss_check import LossCheckSettings
from producer.export.selection import DEFAULT_INCLUDE, OverLength
from producer.export.shards import DEFAULT_SHARD_ROWS, Compression
from workers.record.output_places import ALLOW_LOCATION_FLAG

INCLUDE_ALL = "all"

EXAMPLES = """examples:
  python -m producer export --run qwen-think-v1 --format specforge --to s3://bucket/datasets/qwen-think-v1
  python -m producer export --run qwen-think-v1 --format speculators --to ./speculators-data \\
      --output s3://bucket/runs/qwen-think-v1
"""


def register(commands: Any) -> None:
    """Add the `export` command to `python -m producer`."""
    parser = commands.add_parser(
        "export",
        help="write a run's completions as a trainer's JSONL (specforge, speculators, sharegpt, messages)",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", required=True, help="the run's name")
    parser.add_argument("--format", required=True, choices=[f.value for f in ExportFormat])
    parser.add_argument("--to", required=True, help="destination folder or s3://bucket/prefix")
    parser.add_argument(
        ALLOW_LOCATION_FLAG,
        dest="allow_location",
        action="store_true",
        help="the destination may be under /var, /opt or /srv, in a home folder itself or a hidden "
        "folder of one (refused by default)",
    )
    parser.add_argument(
        "--output", dest="output", help="the run's output (folder or s3://); default: asked of Redis"
    )
    parser.add_argument(
        "--include",
        default="",
        help="quality labels exported beside ok, comma-separated, or 'all' "
        f"({', '.join(q.value for q in Quality if q is not Quality.OK)})",
    )
    parser.add_argument(
        "--thinking",
        choices=[style.value for style in ThinkingStyle],
        default=ThinkingStyle.SEPARATE.value,
        help="sharegpt and messages: reasoning in a field of its own (default) or in <think> tags",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        help="the trainer's sequence length in tokens (default: specforge 4096, speculators 8192, "
        "else none); rows longer are counted, and kept unless --over-length drop",
    )
    parser.add_argument(
        "--over-length",
        choices=[choice.value for choice in OverLength],
        default=OverLength.KEEP.value,
        help="keep (default: trainers cut a long row and still learn from its start) or drop longer rows",
    )
    parser.add_argument("--shard-rows", type=int, default=DEFAULT_SHARD_ROWS, help="rows per JSONL shard")
    parser.add_argument(
        "--compression", choices=[c.value for c in Compression], default=Compression.NONE.value
    )
    defaults = LossCheckSettings()
    parser.add_argument(
        "--min-loss-tokens",
        type=int,
        default=defaults.min_loss_tokens,
        help=f"a row with fewer loss tokens is short (default {defaults.min_loss_tokens})",
    )
    parser.add_argument(
        "--max-short-fraction",
        type=float,
        default=defaults.max_short_fraction,
        help=f"refuse when more of the rows are short (default {defaults.max_short_fraction})",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="the target's tokenizer.json, to count loss tokens of rows without token ids",
    )
    parser.add_argument("--force", action="store_true", help="export even when the loss-token check refuses")
    parser.set_defaults(handler=Deferred("producer.export.command", "cmd_export"))


def parse_include(text: str) -> frozenset[Quality]:
    if text.strip() == INCLUDE_ALL:
        return frozenset(Quality)
    labels = [label.strip() for label in text.split(",") if label.strip()]
    known = {quality.value for quality in Quality}
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise SettingsError(f"--include: unknown quality {unknown[0]!r}; known: {', '.join(sorted(known))}")
    return DEFAULT_INCLUDE | {Quality(label) for label in labels}
