"""`python -m inference <command>`: the GPU-node tools, and the simulator that stands in for SGLang.

Each command module exposes `register(subparsers)`, which adds its parser and sets `handler`
(a function taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging

DESCRIPTION = "The tools a GPU node runs around SGLang, and a simulated SGLang server for trying draftgen."
EPILOG = """on a GPU node, in order:
  python -m inference stage s3://bucket/models/Qwen3.6-27B              # to /dev/shm, verified, resumable
  python -m inference serve --model-path /dev/shm/Qwen3.6-27B --gpus 0-6  # one server per GPU, until ready
  python -m inference wait --url http://127.0.0.1:30000                  # a server started some other way
  python -m inference preflight --url http://127.0.0.1:30000 --max-tokens 32768  # a verdict before the run
without a GPU:
  python -m inference simulate --port 30000                              # a stand-in for SGLang
docs/gpu-nodes.md and docs/simulator.md tell more.
"""

COMMAND_MODULES = (
    "inference.simulator.cli",
    "inference.node.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    exit_code: int = args.handler(args)
    return exit_code
