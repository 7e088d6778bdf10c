"""The parsers of `status`, `pause`, `resume`, `rejects`, `parked` and `metrics`: built at every start-up,
so light (their handlers, with Redis, rich and Prometheus, load when they run)."""

from __future__ import annotations

from typing import Any

from producer.deferred import Deferred

PRICE_ENV = "DRAFTGEN_PRICE_PER_GPU_HOUR"
DEFAULT_WATCH_INTERVAL_S = 2.0
DEFAULT_PAUSE_REASON = "paused by hand"
LISTED_KINDS = ("rejected", "dead")
DEFAULT_PORT = 9108
DEFAULT_ADDRESS = "127.0.0.1"  # unauthenticated: bind wider (--address 0.0.0.0) only on a private network
DEFAULT_PARKED_LISTED = 20
DEFAULT_WAIT_INTERVAL_S = 5.0


def _register_metrics(commands: Any) -> None:
    metrics = commands.add_parser("metrics", help="serve Prometheus metrics of the runs, queues and GPUs")
    metrics.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    metrics.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help=f"bind address (default {DEFAULT_ADDRESS}; the endpoint has no authentication)",
    )
    metrics.add_argument(
        "--runs", nargs="+", metavar="RUN", help="export only these runs (default: every run)"
    )
    metrics.set_defaults(handler=Deferred("producer.status.metrics", "cmd_metrics"))


def _register_rejects(commands: Any) -> None:
    rejects = commands.add_parser(
        "rejects",
        help="list every row refused at enqueue and every dead-lettered prompt, with row, id and reason",
    )
    rejects.add_argument("--run", required=True)
    rejects.add_argument("--only", choices=LISTED_KINDS, help="list only rows rejected, or only dead letters")
    rejects.add_argument("--json", action="store_true", help="one JSON object: run, rejected, dead")
    rejects.add_argument(
        "--output", dest="output", help="read them from the run's output (folder or s3://), not Redis"
    )
    rejects.set_defaults(handler=Deferred("producer.status.command", "cmd_rejects"))


def _register_parked(commands: Any) -> None:
    parked = commands.add_parser(
        "parked", help="list the malformed messages workers parked instead of ending on them, with why"
    )
    parked.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_PARKED_LISTED,
        help=f"how many to list, newest first (default {DEFAULT_PARKED_LISTED})",
    )
    parked.add_argument("--json", action="store_true", help="one JSON object: counts, newest")
    parked.set_defaults(handler=Deferred("producer.status.parked", "cmd_parked"))


def _register_wait_and_runs(commands: Any) -> None:
    wait = commands.add_parser(
        "wait",
        help="wait until a run ends; exit 0 finished, 3 finished with dead letters, 4 paused by the quality "
        "gate, 5 paused otherwise, 124 --timeout passed",
    )
    wait.add_argument("--run", required=True)
    wait.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="give up after SECONDS (exit 124; default: never)"
    )
    wait.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_WAIT_INTERVAL_S,
        metavar="SECONDS",
        help=f"look every SECONDS (default {DEFAULT_WAIT_INTERVAL_S:.0f})",
    )
    wait.set_defaults(handler=Deferred("producer.status.wait", "cmd_wait"))
    runs = commands.add_parser("runs", help="list every run Redis knows, with its state, progress and output")
    runs.add_argument("--json", action="store_true", help="one JSON list, an object per run")
    runs.set_defaults(handler=Deferred("producer.status.runs", "cmd_runs"))


def register(commands: Any) -> None:
    """Add `status`, `pause`, `resume` and `metrics` to the `python -m producer` sub-commands."""
    _register_metrics(commands)
    status = commands.add_parser(
        "status", help="progress, rates, ETA, cost, GPUs, queues, quality and pause state of a run"
    )
    status.add_argument("--run", required=True)
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=DEFAULT_WATCH_INTERVAL_S,
        default=None,
        metavar="SECONDS",
        help=f"refresh every SECONDS (default {DEFAULT_WATCH_INTERVAL_S:.0f}) until Ctrl-C",
    )
    status.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    status.add_argument(
        "--price-per-gpu-hour",
        type=float,
        metavar="USD",
        help=f"for the cost figures (default ${PRICE_ENV}; without either, cost is shown in GPU-hours only)",
    )
    status.set_defaults(handler=Deferred("producer.status.command", "cmd_status"))

    pause_parser = commands.add_parser("pause", help="stop workers taking a run's batches (nothing is lost)")
    pause_parser.add_argument("--run", required=True)
    pause_parser.add_argument("--reason", default=DEFAULT_PAUSE_REASON, help="shown by status")
    pause_parser.set_defaults(handler=Deferred("producer.status.command", "cmd_pause"))

    resume_parser = commands.add_parser("resume", help="let workers take a paused run's batches again")
    resume_parser.add_argument("--run", required=True)
    resume_parser.set_defaults(handler=Deferred("producer.status.command", "cmd_resume"))
    _register_rejects(commands)
    _register_parked(commands)
    _register_wait_and_runs(commands)
