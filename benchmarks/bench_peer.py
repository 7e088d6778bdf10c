"""draftgen beside a plain client of the peer's design, on the same simulated GPUs and prompts, in one run.

Two simulated GPUs (48 slots each, `--length-mix reasoning`, `--speedup` 20, `--stream-interval` as
`python -m node serve` starts SGLang), side by side for single prompts and for conversations of 1-6 user
turns (every turn regenerated, each request holding the client's own earlier answers):
  - draftgen: the real pipeline (Redis, `enqueue`, a real Celery generate worker beside each GPU, the
    uploader), as benchmarks/bench_pipeline.py and bench_drain.py run it;
  - peer-48, peer-64: benchmarks/peer_client.py, SpecForge's regeneration script's design (a thread pool
    of synchronous non-streamed calls, a whole conversation per thread), at concurrency 48 and 64 per
    server. It gets the same two servers the way a peer user runs it, `--server-address a b`: one
    process, conversations dealt round robin, each server capped at the concurrency.
Per run, from the servers' request logs (benchmarks/server_figures.py):
  - wall ÷ ideal: wall from the first request's arrival to the last one's end; ideal the run's output
    tokens ÷ the servers' stated capacity, plus prefilling the prompt tokens the servers did not find in
    their prefix cache (the simulator pauses decoding to prefill; `decode s` is the capacity part alone);
  - slots busy: the mean over that wall of min(requests a server holds, 48) ÷ 48; `sending`: the same up
    to the last request's arrival (the issue's "from first to last request"), before the drain, whose
    length is the longest requests' own (at these sizes a 32k-token request holds its slot ~35 s);
  - turn gap: a conversation's next turn's arrival minus its previous turn's end, at the server (p50/p99);
  - finish spread: how far apart the GPUs ran out of work, in seconds and in median requests;
  - CPU per output token of the client's processes (user + system): draftgen's generate workers, the
    peer's own process; from their first request to the run's end.
Single prompts also get the floor of their own lengths (benchmarks/tail_floor.py): what any order blind
to length, and longest first knowing every length, would make of the end of the run. With
`--answer-signal SIGMA` their rows carry dataset answers that hint at the target's length as a real
dataset's do (benchmarks/length_signal.py); the peer ignores them, as SpecForge's script does.
With `--pin` (the default on 2 cores or more) each tool's processes run pinned to one core each, as the
issue's measurements did: the generate worker of GPU i on core i (modulo the cores; one process per GPU
is draftgen's design, each beside its GPU), the peer's one process on the last core. The simulators,
Redis and the uploader are not pinned.

    .venv/bin/python benchmarks/bench_peer.py [--prompts 600] [--conversations 200] [--speedup 20]
        [--no-pin] [--variant NAME:KEY=VALUE,...] [--stream-interval 32] [--answer-signal SIGMA]
        # the issue's sizes: --prompts 3000 --conversations 800

Last line: `peer_bench` then `<workload>.<client>.<figure>=<value>` for every figure, and
`<workload>.ahead=<figures where draftgen is behind the better peer, or none>`.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_pipeline import MAX_TURNS, MIN_TURNS, SAMPLING, bench_conversations, bench_prompts
from benchmarks.draftgen_fleet import RUN_TIMEOUT_S, draftgen_fleet, run_to_end
from benchmarks.length_signal import hint_correlation, with_dataset_answers
from benchmarks.peer_client import PeerOutcome
from benchmarks.process_cpu import cpu_seconds, pinning_by_default, usable_cores
from benchmarks.server_figures import (
    Ideal,
    finish_spread_s,
    finished,
    ideal,
    percentile,
    request_seconds,
    sending_span_of,
    slots_busy,
    span_of,
    turn_gaps,
)
from benchmarks.tail_floor import tail_floor
from core.records import Prompt
from devstack.local_stack import free_port, start_redis
from inference.simulator import RequestRecord, SimulatorProcess, SimulatorSettings
from inference.simulator.length_mix import LENGTH_MIX_CHOICES, REASONING
from node.settings import DEFAULT_STREAM_INTERVAL_TOKENS

ROOT = Path(__file__).resolve().parent.parent
GPUS = 2
SLOTS = 48
PEER_CONCURRENCIES = (48, 64)
DEFAULT_PROMPTS = 600
DEFAULT_CONVERSATIONS = 200
DEFAULT_SPEEDUP = 20.0
P50, P99 = 0.50, 0.99
MS_PER_S = 1000.0
US_PER_S = 1_000_000.0
SINGLE, CONVERSATIONS = "single", "conversations"


@dataclass(frozen=True)
class Goal:
    slots_busy: float  # at least
    wall_ideal: float  # at most, at the size
    size: int  # the size the wall ÷ ideal goal is set at (a shorter run has a longer tail for its size)


GOALS = {SINGLE: Goal(0.99, 1.02, 3000), CONVERSATIONS: Goal(0.97, 1.05, 800)}
TURN_GAP_P99_GOAL_S = 0.050


def simulator_settings(args: argparse.Namespace) -> SimulatorSettings:
    """The simulators' command line, in one place: every server of every run is started with it."""
    return SimulatorSettings(
        speedup=args.speedup,
        max_running_requests=SLOTS,
        length_mix=args.length_mix,
        stream_interval=args.stream_interval,
    )


@dataclass(frozen=True)
class Pinning:
    generate_workers: list[int] | None  # core of each GPU's worker
    peer: int | None

    def describe(self) -> str:
        if self.generate_workers is None:
            return "not pinned"
        workers = ", ".join(f"GPU {gpu} on core {core}" for gpu, core in enumerate(self.generate_workers))
        return f"draftgen's generate workers {workers}; the peer on core {self.peer}"


def pinning(pin: bool) -> Pinning:
    cores = usable_cores()
    if not pin:
        return Pinning(None, None)
    return Pinning([cores[gpu % len(cores)] for gpu in range(GPUS)], cores[-1])


@dataclass(frozen=True)
class Measured:
    workload: str
    client: str
    wall_s: float
    ideal: Ideal
    slots_busy: float
    slots_busy_sending: float  # up to the last request's arrival
    gaps_s: list[float]
    output_tokens: int
    requests: int
    cpu_s: float
    dropped: int  # conversations a client gave up on (the peer's error rows)
    finish_spread_s: float  # how far apart the GPUs ran out of work
    request_p50_s: float

    @property
    def finish_spread_requests(self) -> float:
        """The GPUs' finish spread in median requests (the issue: within one request of each other)."""
        return self.finish_spread_s / self.request_p50_s

    @property
    def wall_ideal(self) -> float:
        return self.wall_s / self.ideal.seconds

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s * US_PER_S / self.output_tokens

    def gap_ms(self, fraction: float) -> float:
        return percentile(self.gaps_s, fraction) * MS_PER_S

    def figures(self) -> dict[str, float]:
        """Every figure, each better when lower except the slots busy."""
        return {
            "wall_ideal": self.wall_ideal,
            "slots_busy": self.slots_busy,
            "slots_busy_sending": self.slots_busy_sending,
            "gap_p50_ms": self.gap_ms(P50),
            "gap_p99_ms": self.gap_ms(P99),
            "cpu_us_per_token": self.cpu_us_per_token,
            "finish_spread_requests": self.finish_spread_requests,
        }

    def row(self) -> str:
        goal = GOALS[self.workload]
        gaps = f"{self.gap_ms(P50):>8.0f} {self.gap_ms(P99):>8.0f}" if self.gaps_s else f"{'-':>8} {'-':>8}"
        wall_goal, slots_goal = f"≤{goal.wall_ideal:g}", f"≥{goal.slots_busy:g}"
        return (
            f"{self.workload:<13} {self.client:<9} {self.wall_s:>7.1f} {self.ideal.seconds:>7.1f}"
            f" {self.ideal.decode_s:>7.1f} {self.wall_ideal:>7.3f} {wall_goal:>6}"
            f" {self.slots_busy:>6.3f} {self.slots_busy_sending:>7.3f} {slots_goal:>6} {gaps}"
            f" {self.cpu_us_per_token:>7.1f} {self.finish_spread_s:>7.1f} {self.finish_spread_requests:>6.2f}"
            f" {self.output_tokens:>9} {self.requests:>6} {self.dropped:>5}"
        )


HEADER = (
    f"{'workload':<13} {'client':<9} {'wall s':>7} {'ideal s':>7} {'decode':>7} {'÷ ideal':>7} {'goal':>6}"
    f" {'slots':>6} {'sending':>7} {'goal':>6} {'gap p50':>8} {'gap p99':>8} {'µs/tok':>7} {'spread':>7}"
    f" {'÷ req':>6} {'tokens':>9} {'reqs':>6} {'drop':>5}"
)


def measure(
    workload: str,
    client: str,
    run: str,
    settings: SimulatorSettings,
    logs: Sequence[Sequence[RequestRecord]],
    *,
    cpu_s: float,
    dropped: int,
) -> Measured:
    per_server = [finished(records, run) for records in logs]
    every = [r for records in per_server for r in records]
    return Measured(
        workload=workload,
        client=client,
        wall_s=span_of(per_server).seconds,
        ideal=ideal(per_server, settings),
        slots_busy=slots_busy(per_server, SLOTS),
        slots_busy_sending=slots_busy(per_server, SLOTS, sending_span_of(per_server)),
        gaps_s=turn_gaps(every) if workload == CONVERSATIONS else [],
        output_tokens=sum(r.completion_tokens for r in every),
        requests=len(every),
        cpu_s=cpu_s,
        dropped=dropped,
        finish_spread_s=finish_spread_s(per_server),
        request_p50_s=percentile(request_seconds(per_server), P50),
    )


@dataclass(frozen=True)
class Bench:
    """What every run of one bench shares."""

    sims: list[SimulatorProcess]
    redis_url: str
    logs: Path
    pins: Pinning


def draftgen_run(
    bench: Bench, prompts: Sequence[Prompt], run: str, *, env: Mapping[str, str] | None = None
) -> tuple[float, int]:
    """The run through the pipeline (its workers given `env` besides the defaults); the generate workers'
    CPU seconds while it ran, and nothing dropped."""
    with draftgen_fleet(
        bench.sims, bench.redis_url, bench.logs, run, extra_env=env, cpus=bench.pins.generate_workers
    ) as gens:
        before = sum(cpu_seconds(worker.pid) for worker in gens)
        run_to_end(bench.redis_url, bench.logs, prompts, run, sampling=SAMPLING)
        return sum(cpu_seconds(worker.pid) for worker in gens) - before, 0


def peer_run(concurrency: int, bench: Bench, prompts: Sequence[Prompt], run: str) -> tuple[float, int]:
    """The run through the peer-style client, a process of its own; its CPU seconds and dropped count."""
    prompts_file = bench.logs / f"{run}.prompts.json"
    prompts_file.write_bytes(msgspec.json.encode(list(prompts)))
    argv = [
        sys.executable,
        "-m",
        "benchmarks.peer_client",
        "--prompts",
        str(prompts_file),
        "--run",
        run,
        "--concurrency",
        str(concurrency),
        "--sampling",
        msgspec.json.encode(SAMPLING).decode(),
    ]
    for sim in bench.sims:
        argv += ["--server", sim.base_url]
    if bench.pins.peer is not None:
        argv += ["--cpu", str(bench.pins.peer)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        argv,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        check=True,
        timeout=RUN_TIMEOUT_S,
    )
    outcome = msgspec.json.decode(done.stdout.splitlines()[-1], type=PeerOutcome)
    return outcome.cpu_s, outcome.dropped


Runner = Callable[[Bench, Sequence[Prompt], str], tuple[float, int]]


def clients(variants: Mapping[str, Mapping[str, str]]) -> list[tuple[str, Runner]]:
    """draftgen as the README runs it, each variant (workers' settings changed), the peer clients."""
    peers: list[tuple[str, Runner]] = [
        (f"peer-{concurrency}", functools.partial(peer_run, concurrency))
        for concurrency in PEER_CONCURRENCIES
    ]
    tried: list[tuple[str, Runner]] = [
        (name, functools.partial(draftgen_run, env=env)) for name, env in variants.items()
    ]
    return [("draftgen", draftgen_run), *tried, *peers]


def variant(text: str) -> tuple[str, dict[str, str]]:
    """`NAME:KEY=VALUE[,KEY=VALUE]`: a draftgen client run with those worker settings."""
    name, _, settings = text.partition(":")
    pairs = [pair.partition("=") for pair in settings.split(",") if pair]
    if not name or not pairs or any(not key or not equals for key, equals, _ in pairs):
        raise argparse.ArgumentTypeError(f"not NAME:KEY=VALUE[,KEY=VALUE]: {text!r}")
    return name, {key: value for key, _, value in pairs}


def last_line(results: Sequence[Measured]) -> str:
    """Every figure, and per workload the figures in which draftgen is not ahead of the better peer."""
    parts = ["peer_bench"]
    for measured in results:
        for figure, value in measured.figures().items():
            parts.append(f"{measured.workload}.{measured.client}.{figure}={value:.4g}")
    for workload in sorted({m.workload for m in results}, key=(SINGLE, CONVERSATIONS).index):
        ours = next(m for m in results if m.workload == workload and m.client == "draftgen").figures()
        peers = [m.figures() for m in results if m.workload == workload and m.client.startswith("peer")]
        behind = [
            figure
            for figure, value in ours.items()
            if value == value  # NaN: a figure this workload has not (turn gaps of single prompts)
            and any(
                (value < peer[figure]) if figure.startswith("slots_busy") else (value > peer[figure])
                for peer in peers
            )
        ]
        parts.append(f"{workload}.behind={','.join(behind) or 'none'}")
    return " ".join(parts)


def single_prompt_notes(
    prompts: Sequence[Prompt],
    server_logs: Sequence[Sequence[RequestRecord]],
    run: str,
    settings: SimulatorSettings,
    args: argparse.Namespace,
) -> list[str]:
    """What the single prompts' own lengths allow (benchmarks/tail_floor.py) and, with a signal, how well
    the dataset's answers predicted them."""
    answered = [r for records in server_logs for r in finished(records, run)]
    floor = tail_floor([r.completion_tokens for r in answered], settings, GPUS)
    notes = [
        f"single: these {len(answered)} requests' own lengths, decoded as a per-request dispatcher would: "
        f"decode wall ÷ ideal {floor.order_blind:.3f} in any order blind to length (mean of shuffles), "
        f"{floor.clairvoyant:.3f} longest first knowing every length"
    ]
    if args.answer_signal is not None:
        rho = hint_correlation(prompts, answered, run)
        notes.append(
            f"single: dataset answers with noise sigma {args.answer_signal:g}: Spearman {rho:.2f} "
            "against the lengths the target gave"
        )
    return notes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS, help="single prompts")
    parser.add_argument("--conversations", type=int, default=DEFAULT_CONVERSATIONS)
    parser.add_argument("--speedup", type=float, default=DEFAULT_SPEEDUP)
    parser.add_argument("--length-mix", choices=LENGTH_MIX_CHOICES, default=REASONING)
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=pinning_by_default(),
        help="pin each tool's processes to one core each (default: on with 2 cores or more)",
    )
    parser.add_argument(
        "--variant",
        type=variant,
        action="append",
        default=[],
        help="NAME:KEY=VALUE[,KEY=VALUE]: also run draftgen with these worker settings, e.g. "
        "b2:DRAFTGEN_BATCHES_IN_FLIGHT=2",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=DEFAULT_STREAM_INTERVAL_TOKENS,
        help="the servers' --stream-interval in tokens (%(default)s: what `python -m node serve` starts "
        "SGLang with; SGLang's own default is 1)",
    )
    parser.add_argument(
        "--answer-signal",
        type=float,
        metavar="SIGMA",
        help="give each single prompt a dataset answer of the target's length times a lognormal noise of "
        "SIGMA (1.2: a Spearman correlation of about 0.7), as a real dataset's rows carry one "
        "(benchmarks/length_signal.py); default: none, nothing predicts a length",
    )
    args = parser.parse_args()
    settings = simulator_settings(args)
    pins = pinning(args.pin)
    # The first `--conversations` of bench_pipeline's seeded conversations: each gets 1-6 turns.
    conversations = bench_conversations(args.conversations * MAX_TURNS)[: args.conversations]
    singles = bench_prompts(args.prompts)
    if args.answer_signal is not None:
        singles = with_dataset_answers(singles, settings, SAMPLING, sigma=args.answer_signal)
    every = {SINGLE: singles, CONVERSATIONS: conversations}
    workloads = {workload: prompts for workload, prompts in every.items() if prompts}  # 0: not run
    results: list[Measured] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch)
        redis_process = start_redis(free_port(), logs / "redis", logs)
        sims = [SimulatorProcess(settings).start() for _ in range(GPUS)]
        bench = Bench(sims, redis_process.url, logs, pins)
        try:
            for workload, prompts in workloads.items():
                for client, runner in clients(dict(args.variant)):
                    run = f"{client}-{workload}"
                    for sim in sims:
                        sim.admin.reset_requests()
                    started = time.monotonic()
                    cpu_s, dropped = runner(bench, prompts, run)
                    print(f"{run}: {time.monotonic() - started:.1f} s end to end", file=sys.stderr)
                    server_logs = [sim.admin.requests() for sim in sims]
                    results.append(
                        measure(workload, client, run, settings, server_logs, cpu_s=cpu_s, dropped=dropped)
                    )
                    if workload == SINGLE and client == "draftgen":
                        notes.extend(single_prompt_notes(prompts, server_logs, run, settings, args))
        finally:
            for sim in sims:
                sim.stop()
            redis_process.stop()
    turns = sum(c.turn_count for c in conversations)
    print(
        f"{GPUS} GPUs of {SLOTS} slots, length mix {args.length_mix}, speedup {args.speedup:g}, "
        f"stream interval {args.stream_interval}; "
        f"{args.prompts} single prompts; {len(conversations)} conversations of {MIN_TURNS}-{MAX_TURNS} turns "
        f"({turns} turns); {len(usable_cores())} cores, {pins.describe()}"
    )
    print(
        f"goals: wall ÷ ideal at {GOALS[SINGLE].size} single prompts and {GOALS[CONVERSATIONS].size} "
        f"conversations; turn gap p99 ≤ {TURN_GAP_P99_GOAL_S * MS_PER_S:.0f} ms; every figure ahead of the "
        "peer's (gaps in ms, CPU in µs per output token)"
    )
    print(HEADER)
    for measured in results:
        print(measured.row())
    for note in notes:
        print(note)
    print(last_line(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
