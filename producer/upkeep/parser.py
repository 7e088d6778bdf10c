"""The parsers of `verify`, `gc`, `recover`, `files` and `load-functions`: a run's output and Redis state
checked, cleaned, rebuilt, listed, and the protocol's functions loaded."""

from __future__ import annotations

from typing import Any

from producer.deferred import Deferred


def register(commands: Any) -> None:
    """Add the upkeep commands to `python -m producer`."""
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
    verify.set_defaults(handler=Deferred("producer.upkeep.command", "cmd_verify"))

    gc = commands.add_parser(
        "gc", help="remove the objects of committed parts that their manifest entry does not name"
    )
    gc.add_argument("--run", required=True)
    gc.add_argument("--dry-run", action="store_true")
    gc.set_defaults(handler=Deferred("producer.upkeep.command", "cmd_gc"))
    recover = commands.add_parser(
        "recover", help="rebuild a run's Redis state from its output after losing Redis"
    )
    recover.add_argument("--run", required=True)
    recover.add_argument(
        "--output", dest="output", required=True, help="the run's s3://bucket/prefix or folder"
    )
    recover.add_argument(
        "--requeue",
        nargs="+",
        default=[],
        metavar="DATA",
        help="then enqueue the run's data again (files, folders, s3:// URLs, as given to enqueue): only what "
        "was never committed is queued; every input is checked before anything is written",
    )
    recover.set_defaults(handler=Deferred("producer.upkeep.command", "cmd_recover"))

    files = commands.add_parser(
        "files", help="list the committed objects (the only ones to read), one per line"
    )
    files.add_argument("--run", required=True)
    files.set_defaults(handler=Deferred("producer.upkeep.command", "cmd_files"))

    functions = commands.add_parser(
        "load-functions",
        help="load this version's protocol functions into Redis (every enqueue does too): after an "
        "upgrade, before its workers take work",
    )
    functions.set_defaults(handler=Deferred("producer.upkeep.command", "cmd_load_functions"))
