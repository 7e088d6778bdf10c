"""The command-line options of a run's sampling settings, shared by `producer enqueue` and `preflight`."""

from __future__ import annotations

import argparse
from pathlib import Path

SAMPLING_OPTION_NAMES = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "enable_thinking",
    "seed",
)


def add_sampling_options(
    parser: argparse.ArgumentParser, *, title: str, thinking_help: str, seed_help: str
) -> argparse._ArgumentGroup:
    """Add `--config` and one option per sampling field (all default to None: unset)."""
    group = parser.add_argument_group(title)
    group.add_argument("--config", type=Path, help="the run's TOML file (options override it)")
    group.add_argument("--model", help="model name sent in every request (the server's served name)")
    group.add_argument("--temperature", type=float)
    group.add_argument("--top-p", dest="top_p", type=float)
    group.add_argument("--top-k", dest="top_k", type=int)
    group.add_argument("--min-p", dest="min_p", type=float)
    group.add_argument("--max-tokens", dest="max_tokens", type=int, help="budget including thinking")
    group.add_argument(
        "--thinking",
        dest="enable_thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=thinking_help,
    )
    group.add_argument("--seed", type=int, help=seed_help)
    return group
