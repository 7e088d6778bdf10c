"""The end of a run: how long the last requests keep a fleet waiting after the queue is empty.

Two simulated GPUs (48 slots each, the `reasoning` length mix), one generate worker beside each,
the same prompts for every configuration, side by side in one run:
  - makespan ÷ ideal, ideal being the run's output tokens ÷ the fleet's capacity with every slot busy;
  - drain: the seconds from the last request's arrival at a server to the last completion, when
    the fleet's slots empty one by one;
  - imbalance: the seconds between the two GPUs' last completions.

    .venv/bin/python benchmarks/bench_drain.py [--prompts 2000] [--speedup 100]

Configurations: batch size and batches held per worker (`DRAFTGEN_BATCHES_IN_FLIGHT`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.draftgen_fleet import draftgen_fleet, run_to_end
from core.records import Message, Prompt, SamplingSettings
from core.run_settings.model import DEFAULT_BATCH_SIZE
from devstack.local_stack import free_port, start_redis
from inference.simulator import RequestRecord, SimulatorProcess, SimulatorSettings
from inference.simulator.length_mix import REASONING
from workers.settings import DEFAULT_BATCHES_IN_FLIGHT

GPUS = 2
SLOTS = 48
SAMPLING = SamplingSettings(model="bench", max_tokens=32768)
CONFIGURATIONS = (  # (name, batch size, batches held)
    ("default", DEFAULT_BATCH_SIZE, DEFAULT_BATCHES_IN_FLIGHT),
    ("held-2", DEFAULT_BATCH_SIZE, 2),
    ("batch-8", 8, DEFAULT_BATCHES_IN_FLIGHT),
)


@dataclass
class Drain:
    name: str
    makespan_s: float
    ideal_s: float
    drain_s: float
    imbalance_s: float

    def row(self) -> str:
        return (
            f"{self.name:<10} {self.makespan_s:>10.1f} {self.makespan_s / self.ideal_s:>8.3f}"
            f" {self.drain_s:>8.1f} {self.imbalance_s:>10.1f}"
        )


def measure(name: str, per_server: list[list[RequestRecord]], capacity: float) -> Drain:
    done = [[r for r in records if r.status == "ok" and r.finished_at is not None] for records in per_server]
    every = [r for records in done for r in records]
    start = min(r.received_at for r in every)
    last_arrival = max(r.received_at for r in every)
    ends = [max(r.finished_at or 0.0 for r in records) for records in done]
    tokens = sum(r.completion_tokens for r in every)
    return Drain(
        name=name,
        makespan_s=max(ends) - start,
        ideal_s=tokens / (capacity * len(done)),
        drain_s=max(ends) - last_arrival,
        imbalance_s=max(ends) - min(ends),
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--speedup", type=float, default=100.0)
    args = parser.parse_args()
    prompts = [
        Prompt(id=f"d{i}", messages=[Message(role="user", content=f"Drain question {i}: reason it out.")])
        for i in range(args.prompts)
    ]
    settings = SimulatorSettings(
        speedup=args.speedup, max_running_requests=SLOTS, request_log_size=100_000, length_mix=REASONING
    )
    results: list[Drain] = []
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch)
        redis_process = start_redis(free_port(), logs / "redis", logs)
        redis_url = redis_process.url
        sims = [SimulatorProcess(settings).start() for _ in range(GPUS)]
        try:
            for name, batch, held in CONFIGURATIONS:
                for sim in sims:
                    sim.admin.reset_requests()
                held_env = {"DRAFTGEN_BATCHES_IN_FLIGHT": str(held)}
                with draftgen_fleet(sims, redis_url, logs, f"drain-{name}", extra_env=held_env):
                    run_to_end(redis_url, logs, prompts, name, sampling=SAMPLING, batch_size=batch)
                results.append(
                    measure(
                        name,
                        [sim.admin.requests() for sim in sims],
                        settings.capacity_output_tokens_per_wall_s(),
                    )
                )
                print(f"{name}: done", file=sys.stderr)
        finally:
            for sim in sims:
                sim.stop()
            redis_process.stop()
    print(
        f"{args.prompts} prompts, length mix reasoning, {GPUS} GPUs of {SLOTS} slots, "
        f"speedup {args.speedup:g}"
    )
    print(f"{'config':<10} {'makespan s':>10} {'÷ ideal':>8} {'drain s':>8} {'imbalance s':>10}")
    for result in results:
        print(result.row())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
