"""Turns back to back: how long a conversation's slot stays empty between two of its turns; and, with
`--kill`, whether the conversations a killed worker left under way resume before new ones start.

One simulated GPU (48 slots, the reasoning length mix), conversations of 1 to 6 user turns
(benchmarks/bench_pipeline.py's), one generate worker with the defaults. The gap is measured at the
server (benchmarks/server_figures.py): from one turn's last token to the arrival of the next turn's request.
Also the slots held over the span in which conversations still started (bench_pipeline's measure).

With `--kill`, the worker is SIGKILLed once half the conversations are handed over and restarted 2 s later
on the same GPU (benchmarks/bench_restart.py's run): it takes its predecessor's batches back at once. From
the server's log: the conversations under way at the kill (a request before it and one after), how long
each waited to resume, and how many new conversations (no request before the kill) started before the
last of them resumed.

    .venv/bin/python benchmarks/bench_turns.py [--requests 300] [--speedup 20] [--kill]

Last line: turn_gap_p50_ms=<…> turn_gap_p99_ms=<…> (with --kill: new_before_last_resumed=<…> too).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_pipeline import bench_conversations, measure, pipeline_run
from benchmarks.bench_restart import one_reasoning_gpu, one_run
from benchmarks.server_figures import describe_gaps, finished, percentile, turn_gaps
from core.records import Prompt
from core.run_settings.model import DEFAULT_BATCH_SIZE
from inference.simulator import RequestRecord, SimulatorProcess
from workers.settings import DEFAULT_BATCHES_IN_FLIGHT

MS_PER_S = 1000
RUN = "turns"


def conversation_starts(records: list[RequestRecord]) -> dict[str, list[float]]:
    """Each conversation's request arrivals, in order."""
    arrivals: dict[str, list[float]] = defaultdict(list)
    for record in records:
        run, _, rest = record.rid.partition(":")
        if run == RUN:
            arrivals[rest.partition(":")[0]].append(record.received_at)
    return {prompt_id: sorted(times) for prompt_id, times in arrivals.items()}


def after_the_kill(records: list[RequestRecord], killed_at: float) -> tuple[list[float], int]:
    """How long each conversation under way at the kill waited to resume (its first request after it),
    and how many new conversations started before the last of them resumed."""
    arrivals = conversation_starts(records)
    waits = [
        next(t for t in times if t >= killed_at) - killed_at
        for times in arrivals.values()
        if times[0] < killed_at <= times[-1]
    ]
    last_resumed = killed_at + max(waits, default=0.0)
    new_first = sum(1 for times in arrivals.values() if killed_at <= times[0] < last_resumed)
    return waits, new_first


def run_once(sim: SimulatorProcess, redis_url: str, logs: Path, conversations: list[Prompt]) -> float:
    started = time.monotonic()
    pipeline_run(
        sim,
        redis_url,
        logs,
        conversations,
        run=RUN,
        batch_size=DEFAULT_BATCH_SIZE,
        held=DEFAULT_BATCHES_IN_FLIGHT,
    )
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300, help="turn requests, about")
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument("--kill", action="store_true", help="SIGKILL the worker halfway, restart it")
    args = parser.parse_args()
    conversations = bench_conversations(args.requests)
    killed_at: float | None = None
    with one_reasoning_gpu(args.speedup) as (sim, redis_url, logs):
        if args.kill:
            outcome = one_run(sim, redis_url, logs, conversations, name=RUN, kill=True, comeback_gpu=0)
            wall_s, killed_at, records = outcome.wall_s, outcome.killed_at, outcome.records
        else:
            wall_s = run_once(sim, redis_url, logs, conversations)
            records = sim.admin.requests()
    gaps = turn_gaps(finished(records, RUN))
    turns = sum(c.turn_count for c in conversations)
    held = measure(RUN, records).held_share
    print(
        f"{len(conversations)} conversations of 1-6 turns ({turns} turns), reasoning mix, speedup "
        f"{args.speedup:g}, 48 slots: wall {wall_s:.1f} s, slots held {held:.3f}"
    )
    print(f"gap between turns at the server: {describe_gaps(gaps)}")
    p50_ms, p99_ms = percentile(gaps, 0.5) * MS_PER_S, percentile(gaps, 0.99) * MS_PER_S
    last = f"turn_gap_p50_ms={p50_ms:.0f} turn_gap_p99_ms={p99_ms:.0f}"
    if killed_at is not None:
        waits, new_first = after_the_kill(records, killed_at)
        print(
            f"after the kill: {len(waits)} conversations under way resumed after p50 "
            f"{percentile(waits, 0.5):.1f} s, the last after {max(waits, default=0.0):.1f} s; "
            f"{new_first} new conversations started before the last of them"
        )
        last += f" new_before_last_resumed={new_first}"
    print(last)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
