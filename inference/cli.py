"""`python -m inference <command>`: the simulator that stands in for SGLang (the GPU node's own tools are
`python -m node`).

Each command module exposes `register(subparsers)`, which adds its parser and sets `handler`
(a function taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib

from core.command_line import commands_parser, run_command

DESCRIPTION = "A simulated SGLang server for trying draftgen without a GPU."
EPILOG = """without a GPU:
  python -m inference simulate --port 30000                              # a stand-in for SGLang
on a GPU node, `python -m node` stages the model, serves it, waits for it and judges a run's settings.
docs/simulator.md and docs/gpu-nodes.md tell more.
"""

COMMAND_MODULES = ("inference.simulator.cli",)


def build_parser() -> argparse.ArgumentParser:
    parser, subparsers = commands_parser("python -m inference", DESCRIPTION, EPILOG)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)
