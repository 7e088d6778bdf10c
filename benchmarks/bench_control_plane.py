"""Control-plane ceiling: completions/s through Redis, generate workers and the uploader when the
server answers at once (a simulator with tiny outputs and a huge speedup), on this machine's cores.

It also says how far one Redis carries a fleet. Redis's own CPU per completion (its user + system
CPU over the run, and the command time `INFO commandstats` counts: enqueue, lease, stage, commit,
heartbeats, events, Celery's messages, everything) gives the completions/s one Redis core serves, and
so the GPUs it serves at the seeds' rate of 0.8 completions/s per GPU. Redis memory left per prompt
once the run is committed (its `done` set and the rest) gives the ceiling in prompts on a 64 GB Redis;
the run's ids (with the fingerprints of explicit ids) are reported apart: their 65,536 hashes cost a
fixed amount that only a big run spreads.

    .venv/bin/python benchmarks/bench_control_plane.py [--prompts 6000] [--workers 2]

Last line: control_plane_cps=<committed completions per second, enqueue end to last commit>.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.records import Message, Prompt, SamplingSettings
from core.run_settings.model import RunSettings
from devstack.local_stack import free_port, start_celery_worker, start_redis, wait_until, worker_env
from devstack.runs import enqueue_run, memory_by_prefix
from inference.simulator import SimulatorProcess, SimulatorSettings
from workers.state.keys import ID_BUCKETS, RunKeys
from workers.state.ledger import RunLedger

INSTANT_SPEEDUP = 100_000.0
RUN_IDS = "the run's ids"
TINY_THINKING_TOKENS = 20.0
TINY_ANSWER_TOKENS = 10.0
RUN_TIMEOUT_S = 600.0
COMPLETIONS_PER_S_PER_GPU = 0.8  # the seeds' rate: Qwen3.6-27B with MTP on one B200
US_PER_S = 1_000_000
REDIS_MEMORY_BYTES = 64 * 2**30
MILLION = 1_000_000


def redis_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def command_time_us(client: redis.Redis) -> tuple[float, dict[str, float]]:
    """Total microseconds Redis spent in commands, and the five costliest commands."""
    stats = client.info("commandstats")
    per_command = {name.removeprefix("cmdstat_"): float(fields["usec"]) for name, fields in stats.items()}
    top = dict(sorted(per_command.items(), key=lambda item: -item[1])[:5])
    return sum(per_command.values()), top


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=6000)
    parser.add_argument("--workers", type=int, default=2, help="generate workers sharing the one server")
    args = parser.parse_args()
    prompts = [
        Prompt(id=f"c{i}", messages=[Message(role="user", content=f"q {i}")]) for i in range(args.prompts)
    ]
    sim_settings = SimulatorSettings(
        speedup=INSTANT_SPEEDUP,
        thinking_tokens_mean=TINY_THINKING_TOKENS,
        answer_tokens_mean=TINY_ANSWER_TOKENS,
        max_running_requests=1024,
        request_log_size=1,
    )
    # One server per generate worker, as on a fleet: a worker takes its server's seat (recovery/seat.py).
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as servers:
        sims = [servers.enter_context(SimulatorProcess(sim_settings)) for _ in range(args.workers)]
        logs = Path(scratch)
        redis_process = start_redis(free_port(), logs / "redis", logs)
        redis_url = redis_process.url
        client = redis.Redis.from_url(redis_url)
        workers = [
            start_celery_worker(
                f"cp{i}", "generate", worker_env(redis_url, {"DRAFTGEN_SERVER_URL": sim.url}), logs
            )
            for i, sim in enumerate(sims)
        ]
        workers.append(start_celery_worker("cp-up", "upload", worker_env(redis_url), logs, concurrency=1))
        try:
            settings = RunSettings(
                run="cp", sampling=SamplingSettings(max_tokens=256), output=(logs / "out").as_uri()
            )
            client.config_resetstat()
            cpu_before = redis_cpu_s(client)
            memory_before = int(client.info("memory")["used_memory"])
            enqueue_started = time.monotonic()
            enqueue_run(client, redis_url, settings, prompts)
            enqueued = time.monotonic()
            ledger = RunLedger(client, "cp")
            wait_until(
                lambda: ledger.counts().done == args.prompts, timeout_s=RUN_TIMEOUT_S, what="every commit"
            )
            finished = time.monotonic()
            cpu_used_s = redis_cpu_s(client) - cpu_before
            command_us, top_commands = command_time_us(client)
            memory_left = int(client.info("memory")["used_memory"]) - memory_before
            # a fixed cost per bucket that a small run cannot spread: reported apart
            id_bytes = memory_by_prefix(client, {RunKeys("cp").ids_prefix: RUN_IDS}).get(RUN_IDS, 0)
        finally:
            for worker in workers:
                worker.stop()
            redis_process.stop()
    run_s = finished - enqueue_started
    print(
        f"{args.prompts} prompts, {args.workers} generate workers + 1 uploader, instant server, "
        f"enqueue {enqueued - enqueue_started:.1f} s, last commit after {run_s:.1f} s"
    )
    cpu_us = cpu_used_s * US_PER_S / args.prompts
    per_core_cps = US_PER_S / cpu_us
    gpus = per_core_cps / COMPLETIONS_PER_S_PER_GPU
    costliest = ", ".join(f"{name} {us / args.prompts:.0f} us" for name, us in top_commands.items())
    print(f"Redis CPU per completion  {cpu_us:.0f} us (user + system)")
    print(f"  in commands             {command_us / args.prompts:.0f} us; costliest: {costliest}")
    print(f"one Redis core serves     {per_core_cps:,.0f} completions/s = {gpus:,.0f} GPUs at 0.8/s each")
    per_prompt = (memory_left - id_bytes) / args.prompts
    print(
        f"Redis memory per committed prompt {per_prompt:.0f} bytes, the run's ids apart: "
        f"1M prompts {per_prompt * MILLION / 2**20:,.0f} MiB, "
        f"10M {per_prompt * 10 * MILLION / 2**30:.1f} GiB, "
        f"64 GB hold {REDIS_MEMORY_BYTES / per_prompt / MILLION:,.0f}M"
    )
    print(
        f"  + the run's ids, with the fingerprints of explicit ids, {id_bytes / args.prompts:.0f} bytes each "
        f"here ({ID_BUCKETS:,} hashes, sparse at this size; benchmarks/bench_enqueue.py measures them at 1M)"
    )
    print(f"redis_us_per_completion={cpu_us:.0f} fleet_gpus_per_redis_core={gpus:.0f}")
    print(f"control_plane_cps={args.prompts / run_s:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
