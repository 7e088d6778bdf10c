"""draftgen as the benchmarks run it: a real Celery generate worker beside each simulated GPU and one
uploader on the bench's Redis, and a run enqueued in-process (as `enqueue` does) and waited on until its
ledger has nothing left to do."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import redis

from core.records import Prompt, SamplingSettings
from core.run_settings.model import DEFAULT_BATCH_SIZE, RunSettings
from devstack.local_stack import ManagedProcess, start_celery_worker, wait_until, worker_env
from devstack.runs import enqueue_run
from inference.simulator import SimulatorProcess
from workers.state.ledger import RunLedger

RUN_TIMEOUT_S = 1800.0


@contextmanager
def draftgen_fleet(
    sims: Sequence[SimulatorProcess],
    redis_url: str,
    logs: Path,
    name: str,
    *,
    extra_env: Mapping[str, str] | None = None,
    cpus: Sequence[int] | None = None,
) -> Iterator[list[ManagedProcess]]:
    """The generate workers, GPU `i` beside `sims[i]` (pinned to `cpus[i]` when given), and an uploader;
    yields the generate workers and stops them all on exit."""
    started: list[ManagedProcess] = []
    try:
        for gpu, sim in enumerate(sims):
            env = worker_env(
                redis_url, {"DRAFTGEN_SERVER_URL": sim.url, "DRAFTGEN_GPU": str(gpu), **(extra_env or {})}
            )
            cpu = None if cpus is None else cpus[gpu]
            started.append(start_celery_worker(f"{name}-{gpu}", "generate", env, logs, cpu=cpu))
        generators = list(started)
        started.append(
            start_celery_worker(f"{name}-up", "upload", worker_env(redis_url), logs, concurrency=1)
        )
        yield generators
    finally:
        for worker in started:
            worker.stop()


def run_to_end(
    redis_url: str,
    logs: Path,
    prompts: Sequence[Prompt],
    run: str,
    *,
    sampling: SamplingSettings,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> None:
    """Enqueue `prompts` as run `run` (its output a folder under `logs`) and wait until none is left."""
    client = redis.Redis.from_url(redis_url)
    settings = RunSettings(run=run, sampling=sampling, output=(logs / run).as_uri(), batch_size=batch_size)
    enqueue_run(client, redis_url, settings, prompts)
    ledger = RunLedger(client, run)
    wait_until(lambda: ledger.counts().remaining == 0, timeout_s=RUN_TIMEOUT_S, what=f"{run} to finish")
