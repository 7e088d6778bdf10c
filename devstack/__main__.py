"""`python -m devstack demo`: the whole pipeline on this machine (what `scripts/demo` runs)."""

from __future__ import annotations

import argparse
import logging

from devstack import demo


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m devstack")
    demo.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args()
    exit_code: int = args.handler(args)
    return exit_code


raise SystemExit(main())
