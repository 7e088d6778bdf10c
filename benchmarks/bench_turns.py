"""Turns back to back: how long a conversation's slot stays empty between two of its turns.

One simulated GPU (48 slots, the reasoning length mix), conversations of 1 to 6 user turns
(benchmarks/bench_pipeline.py's), one generate worker with the defaults. The gap is measured at the
server (benchmarks/turn_gaps.py): from one turn's last token to the arrival of the next turn's request.
Also the slots held over the span in which conversations still started (bench_pipeline's measure).

    .venv/bin/python benchmarks/bench_turns.py [--requests 300] [--speedup 20]

Last line: turn_gap_p50_ms=<…> turn_gap_p99_ms=<…>.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_pipeline import WINDOW, bench_conversations, measure, pipeline_run
from benchmarks.turn_gaps import describe_gaps, percentile, turn_gaps_s
from devstack.local_stack import free_port, start_redis
from inference.simulator import SimulatorProcess, SimulatorSettings
from inference.simulator.length_mix import REASONING
from workers.settings import DEFAULT_BATCHES_IN_FLIGHT
from workers.state.runs import DEFAULT_BATCH_SIZE

MS_PER_S = 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300, help="turn requests, about")
    parser.add_argument("--speedup", type=float, default=20.0)
    args = parser.parse_args()
    conversations = bench_conversations(args.requests)
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch)
        redis_process = start_redis(free_port(), logs / "redis", logs)
        settings = SimulatorSettings(
            speedup=args.speedup, max_running_requests=WINDOW, request_log_size=100_000, length_mix=REASONING
        )
        try:
            with SimulatorProcess(settings) as sim:
                started = time.monotonic()
                pipeline_run(
                    sim,
                    redis_process.url,
                    logs,
                    conversations,
                    run="turns",
                    batch_size=DEFAULT_BATCH_SIZE,
                    held=DEFAULT_BATCHES_IN_FLIGHT,
                )
                wall_s = time.monotonic() - started
                records = sim.admin.requests()
        finally:
            redis_process.stop()
    gaps = turn_gaps_s(records)
    turns = sum(c.turn_count for c in conversations)
    held = measure("turns", records).held_share
    print(
        f"{len(conversations)} conversations of 1-6 turns ({turns} turns), reasoning mix, speedup "
        f"{args.speedup:g}, 48 slots: wall {wall_s:.1f} s, slots held {held:.3f}"
    )
    print(f"gap between turns at the server: {describe_gaps(gaps)}")
    print(
        f"turn_gap_p50_ms={percentile(gaps, 0.5) * MS_PER_S:.0f} "
        f"turn_gap_p99_ms={percentile(gaps, 0.99) * MS_PER_S:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
