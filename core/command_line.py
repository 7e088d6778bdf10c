"""What `python -m inference` and `python -m node` share: a parser of sub-commands with examples, and
running the handler the chosen one set (each `register(subparsers)` sets `handler`: namespace -> exit)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def commands_parser(prog: str, description: str, epilog: str) -> tuple[argparse.ArgumentParser, Any]:
    """A parser whose help shows the examples as written, and the sub-commands' action to register on."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser, parser.add_subparsers(dest="command", required=True)


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse `argv` and run the chosen sub-command's handler, logging at INFO; its exit code."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    args = parser.parse_args(argv)
    exit_code: int = args.handler(args)
    return exit_code
