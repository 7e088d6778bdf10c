"""Recovery in seconds: what a SIGKILL of the generate worker costs, restarted 2 s later the way systemd's
`Restart=always` brings it back.

One simulated GPU (48 slots, the reasoning length mix), the same prompts for each run, side by side:
  - uninterrupted: one generate worker and the uploader from start to end;
  - restarted: the worker SIGKILLed once half the prompts are handed over, started again 2 s later with
    the same command (same GPU): it takes its dead predecessor's batches back at once (its seat);
  - another label: the same kill, but the worker comes back under another GPU label, so nothing tells
    it the dead one's batches are free: they wait for their leases to run out (60 s), as every
    restart did before seats.
Per run: wall time (enqueue to the last commit), the ratio to uninterrupted, the GPU's idle time after
the kill (no request generating, from the kill until the new worker's first token), completions
generated twice, and verify's word on the output (lost, duplicated). And what the kill threw away:
the tokens the requests in flight had generated when their stream broke (the server's log: cancelled
requests' output so far) plus the earlier copy of each completion generated twice, as GPU-seconds at
the server's capacity (`lost GPU s`), and the least the kill must cost, those plus the idle time, as a
share of the uninterrupted run (`floor ÷`): what no restart can win back without resuming a request from
its streamed output.

    .venv/bin/python benchmarks/bench_restart.py [--prompts 500] [--speedup 20] [--no-another-label]

Last line: restart_wall_ratio=<restarted ÷ uninterrupted> idle_after_kill_s=<restarted>.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_pipeline import SAMPLING, WINDOW, bench_prompts
from core.records import Prompt
from core.run_settings.model import RunSettings
from devstack.local_stack import free_port, start_celery_worker, start_redis, wait_until, worker_env
from devstack.runs import enqueue_run
from inference.simulator import RequestRecord, SimulatorProcess, SimulatorSettings
from inference.simulator.length_mix import REASONING
from node.settings import DEFAULT_STREAM_INTERVAL_TOKENS
from producer.upkeep.verify import verify_run
from workers.record.storage import open_store
from workers.state.ledger import RunLedger

RESTART_AFTER_S = 2.0  # systemd's RestartSec is 5 by our units; a spot or OOM restart is seconds
KILL_AT_FRACTION = 0.5
RUN_TIMEOUT_S = 1800.0


@dataclass
class Outcome:
    name: str
    wall_s: float
    idle_after_kill_s: float | None
    generated_twice: int
    verified: bool
    lost: int
    duplicated: int
    killed_at: float | None = None  # Unix time
    records: list[RequestRecord] = field(default_factory=list)  # the server's log of the run
    thrown_away_tokens: int = 0  # generated, then lost with the kill


def thrown_away_tokens(records: list[RequestRecord], run: str) -> int:
    """Output the kill threw away: what cancelled requests of the run had generated, and every copy but
    the last of a prompt's completions generated more than once."""
    mine = [r for r in records if r.rid.startswith(f"{run}:")]
    cancelled = sum(r.completion_tokens for r in mine if r.status == "cancelled")
    finished: dict[str, list[int]] = {}
    for r in mine:
        if r.status == "ok":
            finished.setdefault(r.rid.split(":")[1], []).append(r.completion_tokens)
    return cancelled + sum(sum(copies[:-1]) for copies in finished.values())


def handed_over(ledger: RunLedger) -> int:
    counts = ledger.counts()
    return counts.staged + counts.done + counts.dead


def idle_after(records: list[RequestRecord], killed_at: float) -> float:
    """From the kill until a request sent after it produced its first token."""
    firsts = [r.first_token_at for r in records if r.received_at >= killed_at and r.first_token_at]
    return (min(firsts) - killed_at) if firsts else float("nan")


def one_run(
    sim: SimulatorProcess,
    redis_url: str,
    logs: Path,
    prompts: list[Prompt],
    *,
    name: str,
    kill: bool,
    comeback_gpu: int,
) -> Outcome:
    client = redis.Redis.from_url(redis_url)
    env = worker_env(redis_url, {"DRAFTGEN_SERVER_URL": sim.url, "DRAFTGEN_GPU": "0"})
    uploader = start_celery_worker(f"{name}-up", "upload", worker_env(redis_url), logs, concurrency=1)
    generator = start_celery_worker(f"{name}-gen", "generate", env, logs)
    sim.admin.reset_requests()
    killed_at: float | None = None
    try:
        settings = RunSettings(run=name, sampling=SAMPLING, output=(logs / name).as_uri())
        started = time.monotonic()
        enqueue_run(client, redis_url, settings, prompts)
        ledger = RunLedger(client, name)
        if kill:
            wait_until(
                lambda: handed_over(ledger) >= KILL_AT_FRACTION * len(prompts),
                timeout_s=RUN_TIMEOUT_S,
                what="half the prompts handed over",
            )
            generator.kill()
            killed_at = time.time()
            time.sleep(RESTART_AFTER_S)
            comeback = {**env, "DRAFTGEN_GPU": str(comeback_gpu)}
            generator = start_celery_worker(f"{name}-gen-again", "generate", comeback, logs)
        wait_until(
            lambda: (c := ledger.counts()).remaining == 0 and c.staged == 0 and c.dead_pending == 0,
            timeout_s=RUN_TIMEOUT_S,
            what=f"{name} to finish",
        )
        wall_s = time.monotonic() - started
    finally:
        generator.stop()
        uploader.stop()
    records = sim.admin.requests()
    ok = Counter(r.rid.split(":")[1] for r in records if r.status == "ok" and r.rid.startswith(f"{name}:"))
    print(f"{name}: requests {dict(Counter(r.status for r in records))}", file=sys.stderr)
    report = verify_run(open_store(settings.output), name, client)
    return Outcome(
        name=name,
        wall_s=wall_s,
        idle_after_kill_s=idle_after(records, killed_at) if killed_at is not None else None,
        generated_twice=sum(1 for count in ok.values() if count > 1),
        verified=report.ok and not report.missing,
        lost=len(report.missing),
        duplicated=len(report.duplicated) + len(report.committed_and_dead),
        killed_at=killed_at,
        records=records,
        thrown_away_tokens=thrown_away_tokens(records, name),
    )


@contextlib.contextmanager
def one_reasoning_gpu(speedup: float) -> Iterator[tuple[SimulatorProcess, str, Path]]:
    """A scratch folder for logs, a redis-server and one simulated GPU (48 slots, the reasoning length mix,
    chunked as `node serve` starts SGLang, a request log long enough for a whole run): (the GPU, Redis's
    URL, the folder)."""
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch)
        redis_process = start_redis(free_port(), logs / "redis", logs)
        settings = SimulatorSettings(
            speedup=speedup,
            max_running_requests=WINDOW,
            request_log_size=100_000,
            length_mix=REASONING,
            stream_interval=DEFAULT_STREAM_INTERVAL_TOKENS,
        )
        try:
            with SimulatorProcess(settings) as sim:
                yield sim, redis_process.url, logs
        finally:
            redis_process.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument(
        "--another-label",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the run whose worker comes back under another label (its batches wait out their leases)",
    )
    args = parser.parse_args()
    prompts = bench_prompts(args.prompts)
    outcomes: list[Outcome] = []
    runs = [("uninterrupted", False, 0), ("restarted", True, 0)]
    if args.another_label:
        runs.append(("another-label", True, 1))
    with one_reasoning_gpu(args.speedup) as (sim, redis_url, logs):
        for name, kill, comeback_gpu in runs:
            outcomes.append(
                one_run(sim, redis_url, logs, prompts, name=name, kill=kill, comeback_gpu=comeback_gpu)
            )
            print(f"{name}: {outcomes[-1].wall_s:.1f} s", file=sys.stderr)
    base = outcomes[0].wall_s
    capacity = sim.settings.capacity_output_tokens_per_wall_s()
    print(f"{args.prompts} prompts, reasoning length mix, speedup {args.speedup:g}, one GPU, 48 slots")
    print(
        f"{'run':<14} {'wall s':>8} {'÷ uninterrupted':>15} {'idle after kill s':>17}"
        f" {'twice':>6} {'lost GPU s':>10} {'floor ÷':>7} {'lost':>5} {'dup':>4}"
    )
    for o in outcomes:
        idle = "" if o.idle_after_kill_s is None else f"{o.idle_after_kill_s:.1f}"
        thrown_s = o.thrown_away_tokens / capacity
        floor = 1 + (thrown_s + (o.idle_after_kill_s or 0.0)) / base
        print(
            f"{o.name:<14} {o.wall_s:>8.1f} {o.wall_s / base:>15.3f} {idle:>17} {o.generated_twice:>6}"
            f" {thrown_s:>10.1f} {floor:>7.3f} {o.lost:>5} {o.duplicated:>4}"
        )
    restarted = outcomes[1]
    print(
        f"restart_wall_ratio={restarted.wall_s / base:.3f} "
        f"idle_after_kill_s={restarted.idle_after_kill_s or 0.0:.1f} "
        f"thrown_away_gpu_s={restarted.thrown_away_tokens / capacity:.1f}"
    )
    return 0 if all(o.verified for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
