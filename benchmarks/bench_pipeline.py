"""Saturation: does the pipeline keep a server's slots full across batch boundaries?

One simulated server (48 slots, a named length mix: `single`, the default, or `reasoning`, the heavy
tail of real reasoning traces, see inference/simulator/length_mix.py), the same prompts for every client,
side by side in one run:
  - capacity: the server's own output tokens/s with every slot busy (stated by the simulator);
  - asyncio-48: a plain asyncio client with a fixed 48-request window (what peer scripts do);
  - one-batch: a generate worker that holds one batch of 48 at a time (slots drain at each batch's tail);
  - pipeline: the default generate worker (batches of 32, 2 held, one shared 48-request window);
  - conversations: the same worker on conversations of 1 to 6 user turns (uniformly, seeded), every
    turn regenerated in order (`--turns all`): about as many requests as `--prompts`.
Steady-state throughput is measured from the server's request log, over the span in which prompts
were still starting: up to the first request of the last prompt to start (every client drains at the
very end, and a conversation's later turns are its drain; that tail is reported apart as makespan).
`slots held`: how full the client keeps the server, the mean over that span of min(requests the server
holds, 48) ÷ 48. Tokens fall short of capacity also while the server prefills (every running request
waits for a prefill batch in the simulator, which has no prefix cache: a conversation's later turns
carry their history, prefilled anew), so for conversations the slots held say what the worker does.

    .venv/bin/python benchmarks/bench_pipeline.py [--prompts 480] [--speedup 20] [--length-mix reasoning]

Last lines: saturation=<pipeline steady tokens/s ÷ capacity>, then the same of the conversations.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import openai
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.records import Message, Prompt, SamplingSettings
from core.run_settings.model import DEFAULT_BATCH_SIZE, RunSettings
from devstack.local_stack import free_port, start_celery_worker, start_redis, wait_until, worker_env
from devstack.runs import enqueue_run
from inference.client import build_request
from inference.simulator import RequestRecord, SimulatorProcess, SimulatorSettings
from inference.simulator.length_mix import LENGTH_MIX_CHOICES, SINGLE
from workers.settings import DEFAULT_BATCHES_IN_FLIGHT
from workers.state.ledger import RunLedger

WINDOW = 48
WARMUP_FRACTION = 0.1  # the first slice of a run is excluded: every client starts by filling the slots
RUN_TIMEOUT_S = 1800.0
SAMPLES = 500  # instants at which the running requests are counted
SAMPLING = SamplingSettings(model="bench", max_tokens=32768)
MIN_TURNS, MAX_TURNS = 1, 6
CONVERSATION_SEED = 22


def bench_conversations(requests: int, *, seed: int = CONVERSATION_SEED) -> list[Prompt]:
    """Conversations of MIN_TURNS to MAX_TURNS user turns, about `requests` turns in all."""
    draw = random.Random(seed)
    conversations: list[Prompt] = []
    turns_so_far = 0
    while turns_so_far < requests:
        turns = draw.randint(MIN_TURNS, MAX_TURNS)
        index = len(conversations)
        messages = [
            Message(role="user", content=f"Conversation {index}, question {turn}: explain step by step.")
            for turn in range(1, turns + 1)
        ]
        ends = list(range(1, turns + 1)) if turns > 1 else []
        conversations.append(Prompt(id=f"c{index}", messages=messages, turn_ends=ends))
        turns_so_far += turns
    return conversations


def bench_prompts(count: int) -> list[Prompt]:
    return [
        Prompt(
            id=f"b{i}",
            messages=[Message(role="user", content=f"Benchmark question {i}: explain step by step.")],
        )
        for i in range(count)
    ]


@dataclass
class Measured:
    name: str
    steady_tokens_per_s: float
    makespan_s: float
    total_tokens: int
    short_share: float  # of instants while requests still arrived, with fewer than 48 running
    held_share: float  # mean of min(requests the server holds, 48) ÷ 48 over those instants

    def row(self, capacity: float) -> str:
        ideal_s = self.total_tokens / capacity
        return (
            f"{self.name:<12} {self.steady_tokens_per_s:>12.0f} {self.steady_tokens_per_s / capacity:>10.3f}"
            f" {self.makespan_s:>10.1f} {self.makespan_s / ideal_s:>10.3f} {self.short_share:>10.3f}"
            f" {self.held_share:>10.3f}"
        )


def measure(name: str, records: list[RequestRecord]) -> Measured:
    """Tokens produced while requests were still arriving, per second; tokens spread evenly over each
    request's decode span."""
    done = [r for r in records if r.status == "ok" and r.finished_at is not None]
    start = min(r.received_at for r in done)
    first_request: dict[str, float] = {}
    for record in done:
        prompt_id = record.rid.split(":")[1]
        first_request[prompt_id] = min(record.received_at, first_request.get(prompt_id, record.received_at))
    last_arrival = max(first_request.values())  # the last prompt to start: after it, the drain
    end = max(r.finished_at for r in done if r.finished_at is not None)
    window_start = start + WARMUP_FRACTION * (last_arrival - start)
    produced = 0.0
    for record in done:
        first = record.first_token_at or record.received_at
        finished = record.finished_at or first
        span = max(finished - first, 1e-9)
        overlap = max(0.0, min(finished, last_arrival) - max(first, window_start))
        produced += record.completion_tokens * overlap / span
    instants = [window_start + (last_arrival - window_start) * i / SAMPLES for i in range(SAMPLES)]
    running = [
        sum(1 for r in done if (r.first_token_at or r.received_at) <= t < (r.finished_at or t))
        for t in instants
    ]
    held = [sum(1 for r in done if r.received_at <= t < (r.finished_at or t)) for t in instants]
    return Measured(
        name=name,
        steady_tokens_per_s=produced / (last_arrival - window_start),
        makespan_s=end - start,
        total_tokens=sum(r.completion_tokens for r in done),
        short_share=sum(count < WINDOW for count in running) / SAMPLES,
        held_share=sum(min(count, WINDOW) for count in held) / (WINDOW * SAMPLES),
    )


async def asyncio_client(sim: SimulatorProcess, prompts: list[Prompt]) -> None:
    client = openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", max_retries=0, timeout=RUN_TIMEOUT_S)
    window = asyncio.Semaphore(WINDOW)

    async def one(prompt: Prompt) -> None:
        async with window:
            stream = await client.chat.completions.create(
                **build_request(prompt.messages, SAMPLING, f"asyncio:{prompt.id}")
            )
            async with stream:
                async for _chunk in stream:  # the workers' request is streamed: read it to its end
                    pass

    await asyncio.gather(*(one(p) for p in prompts))
    await client.close()


def pipeline_run(
    sim: SimulatorProcess,
    redis_url: str,
    logs: Path,
    prompts: list[Prompt],
    *,
    run: str,
    batch_size: int,
    held: int,
) -> None:
    client = redis.Redis.from_url(redis_url)
    env = worker_env(
        redis_url,
        {
            "DRAFTGEN_SERVER_URL": sim.url,
            "DRAFTGEN_BATCHES_IN_FLIGHT": str(held),
            "DRAFTGEN_MAX_IN_FLIGHT": str(WINDOW),
        },
    )
    generator = start_celery_worker(f"bench-{run}", "generate", env, logs)
    uploader = start_celery_worker(f"bench-{run}-up", "upload", worker_env(redis_url), logs, concurrency=1)
    try:
        settings = RunSettings(
            run=run, sampling=SAMPLING, output=(logs / run).as_uri(), batch_size=batch_size
        )
        enqueue_run(client, redis_url, settings, prompts)
        ledger = RunLedger(client, run)
        wait_until(lambda: ledger.counts().remaining == 0, timeout_s=RUN_TIMEOUT_S, what=f"{run} to finish")
    finally:
        generator.stop()
        uploader.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=480)
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument("--length-mix", choices=LENGTH_MIX_CHOICES, default=SINGLE)
    args = parser.parse_args()
    prompts = bench_prompts(args.prompts)
    conversations = bench_conversations(args.prompts)
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch)
        redis_process = start_redis(free_port(), logs / "redis", logs)
        redis_url = redis_process.url
        settings = SimulatorSettings(
            speedup=args.speedup,
            max_running_requests=WINDOW,
            request_log_size=100_000,
            length_mix=args.length_mix,
        )
        results: list[Measured] = []
        try:
            with SimulatorProcess(settings) as sim:
                capacity = settings.capacity_output_tokens_per_wall_s()
                runs: list[tuple[str, Callable[[], object]]] = [
                    ("asyncio-48", lambda: asyncio.run(asyncio_client(sim, prompts))),
                    (
                        "one-batch",
                        lambda: pipeline_run(
                            sim, redis_url, logs, prompts, run="one-batch", batch_size=WINDOW, held=1
                        ),
                    ),
                    (
                        "pipeline",
                        lambda: pipeline_run(
                            sim,
                            redis_url,
                            logs,
                            prompts,
                            run="pipeline",
                            batch_size=DEFAULT_BATCH_SIZE,
                            held=DEFAULT_BATCHES_IN_FLIGHT,
                        ),
                    ),
                    (
                        "conversations",
                        lambda: pipeline_run(
                            sim,
                            redis_url,
                            logs,
                            conversations,
                            run="conversations",
                            batch_size=DEFAULT_BATCH_SIZE,
                            held=DEFAULT_BATCHES_IN_FLIGHT,
                        ),
                    ),
                ]
                for name, go in runs:
                    sim.admin.reset_requests()
                    started = time.monotonic()
                    go()
                    print(f"{name}: {time.monotonic() - started:.1f} s", file=sys.stderr)
                    results.append(measure(name, sim.admin.requests()))
        finally:
            redis_process.stop()
    print(f"{args.prompts} prompts, length mix {args.length_mix}, speedup {args.speedup:g}, 48 slots")
    print(f"capacity: {capacity:.0f} output tokens/s (wall) with every slot busy")
    print(
        f"{'client':<12} {'steady tok/s':>12} {'÷ capacity':>10} {'makespan s':>10} {'÷ ideal':>10}"
        f" {'<48 running':>10} {'slots held':>10}"
    )
    for measured in results:
        print(measured.row(capacity))
    turns = sum(c.turn_count for c in conversations)
    print(
        f"conversations: {len(conversations)} of {MIN_TURNS}-{MAX_TURNS} turns, {turns} turns "
        f"(seed {CONVERSATION_SEED})"
    )
    by_name = {m.name: m for m in results}
    print(f"saturation={by_name['pipeline'].steady_tokens_per_s / capacity:.3f}")
    print(f"saturation_conversations={by_name['conversations'].steady_tokens_per_s / capacity:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
