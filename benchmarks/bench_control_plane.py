"""Control-plane ceiling: completions/s through Redis, generate workers and the uploader when the
server answers at once (a simulator with tiny outputs and a huge speedup), on this machine's cores.

    .venv/bin/python benchmarks/bench_control_plane.py [--prompts 6000] [--workers 2]

Last line: control_plane_cps=<committed completions per second, enqueue end to last commit>.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.records import Message, Prompt, SamplingSettings
from inference.simulator import SimulatorProcess, SimulatorSettings
from producer.enqueue import Enqueuer, pin_settings
from producer.local_stack import free_port, start_celery_worker, start_redis, wait_until, worker_env
from producer.publisher import BatchPublisher
from workers.app import make_app
from workers.ledger import RunLedger
from workers.runs import RunSettings
from workers.settings import WorkerSettings

INSTANT_SPEEDUP = 100_000.0
TINY_THINKING_TOKENS = 20.0
TINY_ANSWER_TOKENS = 10.0
RUN_TIMEOUT_S = 600.0


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
    with tempfile.TemporaryDirectory() as scratch, SimulatorProcess(sim_settings) as sim:
        logs = Path(scratch)
        redis_process = start_redis(free_port(), logs / "redis", logs)
        redis_url = f"redis://127.0.0.1:{redis_process.argv[redis_process.argv.index('--port') + 1]}/0"
        client = redis.Redis.from_url(redis_url)
        env = worker_env(redis_url, {"DRAFTGEN_SERVER_URL": sim.url})
        workers = [start_celery_worker(f"cp{i}", "generate", env, logs) for i in range(args.workers)]
        workers.append(start_celery_worker("cp-up", "upload", worker_env(redis_url), logs, concurrency=1))
        try:
            settings = RunSettings(
                run="cp", sampling=SamplingSettings(max_tokens=256), output_url=(logs / "out").as_uri()
            )
            publisher = BatchPublisher(make_app(WorkerSettings(redis_url=redis_url)))
            enqueue_started = time.monotonic()
            Enqueuer(client, pin_settings(client, settings), publisher, source="bench").enqueue(prompts)
            publisher.close()
            enqueued = time.monotonic()
            ledger = RunLedger(client, "cp")
            wait_until(
                lambda: ledger.counts().done == args.prompts, timeout_s=RUN_TIMEOUT_S, what="every commit"
            )
            finished = time.monotonic()
        finally:
            for worker in workers:
                worker.stop()
            redis_process.stop()
    run_s = finished - enqueue_started
    print(
        f"{args.prompts} prompts, {args.workers} generate workers + 1 uploader, instant server, "
        f"enqueue {enqueued - enqueue_started:.1f} s, last commit after {run_s:.1f} s"
    )
    print(f"control_plane_cps={args.prompts / run_s:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
