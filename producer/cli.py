"""`python -m producer <command>`: enqueue prompts into a run, verify its output, remove orphans."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from core.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from producer.errors import ProducerError, as_producer_error, lower_errors
from producer.settings import ProducerSettings

# The commands, a folder each: its parser.py exposes `register(subparsers)`, adding parsers whose `handler`
# (in its command.py, imported when it runs) takes (args, ProducerSettings) and returns an exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "producer.enqueue.parser",
    "producer.upkeep.parser",
    "producer.export.parser",
    "producer.report.parser",
    "producer.status.parser",
)

HELP_EPILOG = """examples:
  python -m producer enqueue prompts.jsonl --run qwen-think-v1 --max-tokens 32768 \
      --output s3://bucket/runs/qwen-think-v1   # the run's own; by default ./output/qwen-think-v1
  python -m producer enqueue s3://bucket/data/train.parquet --run qwen-think-v1   # again: adds only new
  python -m producer verify --run qwen-think-v1
  python -m producer gc --run qwen-think-v1 --dry-run
  python -m producer recover --run qwen-think-v1 --output s3://bucket/runs/qwen-think-v1 \
      --requeue s3://bucket/data/train.parquet   # Redis lost: rebuilt from the output, the rest queued
  python -c "import pandas as pd, sys; print(pd.concat(map(pd.read_parquet, sys.argv[1:])))" \
      $(python -m producer files --run qwen-think-v1)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m producer",
        description=__doc__,
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--redis-url",
        help="default: $DRAFTGEN_REDIS_URL or redis://127.0.0.1:6379/0; one holding a password is refused "
        "(any user reads a command line): set DRAFTGEN_REDIS_URL",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(commands)
    return parser


PASSWORD_ON_THE_COMMAND_LINE = (
    "--redis-url holds a password, which every user of this machine can read while the command runs (ps) "
    "and the shell keeps in its history: set DRAFTGEN_REDIS_URL instead (on a fleet, from the "
    "redis-producer.env deploy/redis-credentials.sh writes)"
)


def _password_on_the_command_line(redis_url: str | None) -> bool:
    from workers.settings import has_password

    return bool(redis_url) and has_password(str(redis_url))


def _silence_stdout() -> None:
    """Point stdout at /dev/null: flushing what is left for a closed pipe would raise again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _fail(message: str, exit_code: int, *, retry_helps: bool = False) -> int:
    print(f"error: {message}", file=sys.stderr)
    if retry_helps:
        print("a retry helps: run the same command again once that is fixed", file=sys.stderr)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every refusal is one or two lines on stderr and an exit code: EXIT_USAGE for
    what the user must change, EXIT_FAILED for a failure (see producer/errors.py), never a traceback."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if _password_on_the_command_line(args.redis_url):
        return _fail(PASSWORD_ON_THE_COMMAND_LINE, EXIT_USAGE)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `status --watch | head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_OK
    except ProducerError as error:
        return _fail(str(error), error.exit_code, retry_helps=error.retry_helps)


def _run(args: argparse.Namespace) -> int:
    """The command, with what the layers below raise turned into the producer's one tree."""
    settings = ProducerSettings()  # until the environment is read (a bad variable fails that)
    try:
        settings = ProducerSettings.from_env()
        exit_code: int = args.handler(args, settings)
    except lower_errors() as error:  # evaluated only when an error propagates
        from producer.run_access import chosen_redis_url

        raise as_producer_error(error, redis_url=chosen_redis_url(args, settings)) from error
    return exit_code
