"""`python -m devstack demo`: the whole pipeline on this machine, with simulated GPUs.

Starts redis-server (the shipped config), one simulated SGLang server per GPU, a generate worker
per GPU, the uploader and Flower; enqueues the bundled sample; waits; verifies; says where to look.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_SIGNAL_BASE
from core.private_files import write_private
from devstack.local_stack import (
    PROJECT_ROOT,
    ManagedProcess,
    flower_process,
    free_port,
    http_ok,
    start_celery_worker,
    start_redis,
    worker_env,
)
from inference.sglang_defaults import SGLANG_BASE_PORT
from inference.simulator import SimulatorProcess, SimulatorSettings
from node.settings import DEFAULT_STREAM_INTERVAL_TOKENS
from workers.settings import redacted_url
from workers.state.ledger import RunLedger
from workers.state.redis_client import client_for

SAMPLE_DATA = PROJECT_ROOT / "producer" / "data" / "sample.jsonl"
DEFAULT_WORKDIR = Path(".demo")
DEFAULT_GPUS = 2
DEFAULT_SPEEDUP = 20.0  # the sample's ~700k output tokens take ~20 s instead of ~3 minutes on two GPUs
DEFAULT_REDIS_PORT = 6390  # not 6379: never touch a Redis the user already runs
# The demo's Redis URL with its password (made at the first start, kept beside the data), readable by
# its owner only, for the commands the demo suggests; the screen shows the URL masked.
REDIS_URL_FILE = "redis-url"
DEFAULT_FLOWER_PORT = 5555
RUN_TIMEOUT_S = 600.0
PROGRESS_POLL_S = 0.5
DEMO_WORKER_ENV = {"DRAFTGEN_UPLOAD_MAX_AGE_S": "5", "DRAFTGEN_UPLOAD_MAX_COMPLETIONS": "100"}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class DemoStopped(Exception):
    """A stop signal arrived: the stack comes down as on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    raise DemoStopped(signum)


def port_or_free(preferred: int) -> int:
    """The preferred port when nothing listens there, else any free one."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


@dataclass
class DemoStack:
    workdir: Path
    processes: list[ManagedProcess] = field(default_factory=list)
    simulators: list[SimulatorProcess] = field(default_factory=list)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        for sim in self.simulators:
            sim.stop()


def redis_url_file(workdir: Path) -> Path:
    return workdir.resolve() / REDIS_URL_FILE


@contextlib.contextmanager
def running_stack(args: argparse.Namespace, console: Console) -> Iterator[tuple[DemoStack, str, int]]:
    workdir: Path = args.workdir.resolve()
    logs = workdir / "logs"
    stack = DemoStack(workdir)
    try:
        redis_server = start_redis(port_or_free(args.redis_port), workdir / "redis", logs)
        stack.processes.append(redis_server)
        redis_url = redis_server.url
        write_private(redis_url_file(workdir), redis_url + "\n")
        console.print(
            f"redis-server      {redacted_url(redis_url)} (AOF in {workdir / 'redis'}; "
            f"the URL with its password in {redis_url_file(workdir)}, readable by you only)"
        )
        for gpu in range(args.gpus):
            port = port_or_free(SGLANG_BASE_PORT + gpu)
            # Chunked as `python -m node serve` starts SGLang (its --stream-interval).
            sim_settings = SimulatorSettings(
                port=port,
                speedup=args.speedup,
                enable_metrics=True,
                stream_interval=DEFAULT_STREAM_INTERVAL_TOKENS,
            )
            stack.simulators.append(SimulatorProcess(sim_settings, keep_port=True).start())
            console.print(
                f"GPU {gpu}             simulated SGLang at http://127.0.0.1:{port} (x{args.speedup:g} speed)"
            )
        for gpu, sim in enumerate(stack.simulators):
            env = worker_env(
                redis_url, {**DEMO_WORKER_ENV, "DRAFTGEN_SERVER_URL": sim.url, "DRAFTGEN_GPU": str(gpu)}
            )
            stack.processes.append(start_celery_worker(f"gen{gpu}", "generate", env, logs))
        stack.processes.append(
            start_celery_worker(
                "upload", "upload", worker_env(redis_url, DEMO_WORKER_ENV), logs, concurrency=1
            )
        )
        console.print(f"workers           {args.gpus} generate + 1 uploader (logs in {logs})")
        flower_port = port_or_free(args.flower_port)
        flower = flower_process(flower_port, worker_env(redis_url), logs).start()
        stack.processes.append(flower)
        flower.wait_ready(lambda: http_ok(f"http://127.0.0.1:{flower_port}/healthcheck"))
        console.print(f"Flower            http://127.0.0.1:{flower_port}")
        yield stack, redis_url, flower_port
    finally:
        stack.stop()


def wait_for_run(client: redis.Redis, run: str, console: Console) -> None:
    ledger = RunLedger(client, run)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("committed", total=ledger.counts().enqueued)
        while True:
            counts = ledger.counts()
            progress.update(task, completed=counts.done + counts.dead)
            if counts.remaining == 0 and counts.staged == 0 and counts.dead_pending == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run} did not finish in {RUN_TIMEOUT_S:.0f} s: {counts}")
            time.sleep(PROGRESS_POLL_S)


def cmd_demo(args: argparse.Namespace) -> int:
    console = Console(soft_wrap=True)
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in STOP_SIGNALS}
    try:
        return _demo(args, console)
    except DemoStopped as stopped:
        console.print(f"\n{stopped}: everything the demo started is stopped")
        return EXIT_SIGNAL_BASE + stopped.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _demo(args: argparse.Namespace, console: Console) -> int:
    from producer.cli import main as producer_main  # the real commands, as a user would type them
    from producer.settings import REDIS_URL_ENV

    run = args.run or time.strftime("demo-%Y%m%d-%H%M%S")
    output = (args.workdir / "output" / run).resolve()  # an output belongs to one run
    with running_stack(args, console) as (stack, redis_url, flower_port):
        os.environ[REDIS_URL_ENV] = redis_url  # the commands below read it there: never on a command line
        options = [option for option in args.enqueue_options if option != "--"]
        console.print(
            f"\n$ python -m producer enqueue {args.data} --run {run} --output {output} "
            f"{shlex.join(options)}".rstrip()
        )
        enqueue_args = ["enqueue", str(args.data), "--run", run, "--output", str(output), *options]
        if producer_main(enqueue_args) != 0:
            return EXIT_FAILED
        wait_for_run(client_for(redis_url), run, console)
        console.print(f"\n$ python -m producer verify --run {run}")
        verified = producer_main(["verify", "--run", run])
        console.print(
            f"\nOutput:  {output} (Parquet under data/; the committed objects are listed under manifest/)\n"
            "         (in a new shell, `source .venv/bin/activate` first: draftgen is installed there)\n"
            f"         python -m producer report --run {run} --output {output}\n"
            f"         python -m producer export --run {run} --output {output} --format sharegpt --to DIR\n"
            f"Logs:    {stack.workdir / 'logs'}"
        )
        if args.exit:
            return EXIT_OK if verified == 0 else EXIT_FAILED
        console.print(
            f"Flower:  http://127.0.0.1:{flower_port}  (Broker: both queues; Tasks: each batch for its whole "
            "life; a worker's page, tab Other: its GPU's rates)\n"
            f'         DRAFTGEN_REDIS_URL="$(cat {redis_url_file(args.workdir)})" '
            f"python -m producer status --run {run}\n"
            "\nEverything is still running so you can look around. Press Ctrl-C to stop."
        )
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(1)
    return EXIT_OK if verified == 0 else EXIT_FAILED


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo", help="run the whole pipeline locally on simulated GPUs")
    demo.add_argument(
        "--data", type=Path, default=SAMPLE_DATA, help="prompts to run (default: the bundled sample)"
    )
    demo.add_argument("--run", help="run name (default: demo-<date>-<time>)")
    demo.add_argument("--gpus", type=int, default=DEFAULT_GPUS, help="simulated GPUs (default 2)")
    demo.add_argument("--speedup", type=float, default=DEFAULT_SPEEDUP, help="simulator speed factor")
    demo.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="Redis data, logs, output")
    demo.add_argument("--redis-port", type=int, default=DEFAULT_REDIS_PORT)
    demo.add_argument("--flower-port", type=int, default=DEFAULT_FLOWER_PORT)
    demo.add_argument("--exit", action="store_true", help="stop everything after verify instead of waiting")
    demo.add_argument(
        "enqueue_options",
        nargs=argparse.REMAINDER,
        metavar="-- ENQUEUE_OPTIONS",
        help="after --, options of `producer enqueue` for --data: your columns and chat shape, e.g. "
        "-- --messages-field dialog --turn-keys speaker,text --roles human=user,bot=assistant",
    )
    demo.set_defaults(handler=cmd_demo)
