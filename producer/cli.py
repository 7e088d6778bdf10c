"""`python -m producer <command>`: enqueue prompts into a run, verify its output, remove orphans."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from core.exit_codes import EXIT_INTERRUPTED, EXIT_OK
from core.run_settings.options import add_run_options
from producer.deferred import Deferred
from producer.errors import ProducerError, as_producer_error, lower_errors
from producer.settings import MAX_ENQUEUE_PROCESSES, PROCESSES_MIN_ROWS, ProducerSettings

# More sub-commands: each module exposes `register(subparsers)`, adding parsers whose `handler`
# takes (args, ProducerSettings) and returns an exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "producer.export_cli",
    "producer.report_cli",
    "producer.status_parsers",
)

HELP_EPILOG = """examples:
  python -m producer enqueue prompts.jsonl --run qwen-think-v1 --max-tokens 32768 --output s3://bucket/runs
  python -m producer enqueue s3://bucket/data/train.parquet --run qwen-think-v1   # again: adds only new
  python -m producer verify --run qwen-think-v1
  python -m producer gc --run qwen-think-v1 --dry-run
  python -m producer recover --run qwen-think-v1 --output s3://bucket/runs   # after losing Redis
  python -c "import pandas as pd, sys; print(pd.concat(map(pd.read_parquet, sys.argv[1:])))" \
      $(python -m producer files --run qwen-think-v1)
"""


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m producer",
        description=__doc__,
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--redis-url", help="default: $DRAFTGEN_REDIS_URL or redis://127.0.0.1:6379/0")
    commands = parser.add_subparsers(dest="command", required=True)

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
    enqueue.set_defaults(handler=Deferred("producer.enqueue_command", "cmd_enqueue"))

    verify = commands.add_parser(
        "verify", help="check every prompt is committed exactly once or dead-lettered"
    )
    verify.add_argument("--run", required=True)
    verify.add_argument(
        "--output",
        dest="output",
        default=None,
        help="prove it from this output (folder or s3://) alone, without Redis",
    )
    verify.set_defaults(handler=Deferred("producer.commands", "cmd_verify"))

    gc = commands.add_parser(
        "gc", help="remove the objects of committed parts that their manifest entry does not name"
    )
    gc.add_argument("--run", required=True)
    gc.add_argument("--dry-run", action="store_true")
    gc.set_defaults(handler=Deferred("producer.commands", "cmd_gc"))
    recover = commands.add_parser(
        "recover", help="rebuild a run's Redis state from its output after losing Redis"
    )
    recover.add_argument("--run", required=True)
    recover.add_argument(
        "--output", dest="output", required=True, help="the run's s3://bucket/prefix or folder"
    )
    recover.set_defaults(handler=Deferred("producer.commands", "cmd_recover"))

    files = commands.add_parser(
        "files", help="list the committed objects (the only ones to read), one per line"
    )
    files.add_argument("--run", required=True)
    files.set_defaults(handler=Deferred("producer.commands", "cmd_files"))

    functions = commands.add_parser(
        "load-functions",
        help="load this version's protocol functions into Redis (every enqueue does too): after an "
        "upgrade, before its workers take work",
    )
    functions.set_defaults(handler=Deferred("producer.commands", "cmd_load_functions"))
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(commands)
    return parser


def _warn_of_a_password_on_the_command_line(redis_url: str | None) -> None:
    """A person who typed a password into a command (stdin a terminal) is told where it shows."""
    from workers.settings import has_password

    if redis_url and has_password(redis_url) and sys.stdin is not None and sys.stdin.isatty():
        print(
            "warning: --redis-url holds a password, which every user of this machine can read (ps, the "
            "shell's history): set DRAFTGEN_REDIS_URL instead",
            file=sys.stderr,
        )


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
    _warn_of_a_password_on_the_command_line(args.redis_url)
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
