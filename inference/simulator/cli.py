"""`python -m inference simulate ...` (and `python -m inference.simulator ...`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from core.exit_codes import EXIT_USAGE
from inference.simulator.settings import (
    SimulatorSettings,
    add_settings_arguments,
    settings_from_args,
)

COMMAND = "simulate"
DESCRIPTION = (
    "A CPU simulator of an SGLang 0.5.23 server serving a thinking model (qwen3 reasoning parser, "
    "NEXTN speculative decoding): same routes, fields, errors, health and metrics; filler text."
)


def run(settings: SimulatorSettings, launch_command: str | None = None) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code."""
    from inference.simulator.server import serve  # aiohttp: only when simulating

    return asyncio.run(serve(settings, launch_command or shlex.join([sys.executable, *sys.argv])))


def handle(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"simulate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run(settings)


def register(subparsers: Any) -> None:
    """Add the `simulate` sub-command to `python -m inference`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND, help="Run the SGLang simulator.", description=DESCRIPTION
    )
    add_settings_arguments(parser)
    parser.set_defaults(handler=handle)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m inference.simulator [options]`: the same options without the sub-command."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m inference.simulator", description=DESCRIPTION)
    add_settings_arguments(parser)
    return handle(parser.parse_args(None if argv is None else list(argv)))
