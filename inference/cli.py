"""`python -m inference <command>`: one sub-command per module, each registering its own parser.

A command module exposes `register(subparsers)`, which adds its parser and sets `handler`
(a function taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging

COMMAND_MODULES = (
    "inference.simulator.cli",
    "inference.node.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m inference", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    exit_code: int = args.handler(args)
    return exit_code
