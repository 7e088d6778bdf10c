"""A local pipeline of real processes for the integration tests: simulated GPUs, workers, uploader."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pyarrow.parquet as pq

from core.backoff import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_CAP_S
from devstack.local_stack import PROJECT_ROOT, ManagedProcess, start_celery_worker, wait_until, worker_env
from inference.client_settings import DEFAULT_REQUEST_TIMEOUT_S
from inference.simulator import SimulatorProcess, SimulatorSettings
from node.settings import DEFAULT_STREAM_INTERVAL_TOKENS as SERVE_STREAM_INTERVAL
from workers.broker.parked_messages import parked_counts, recent_parked
from workers.record.manifest import completion_keys, read_manifest
from workers.record.storage import open_store
from workers.record.upload_settings import DEFAULT_UPLOAD_MAX_AGE_S, DEFAULT_UPLOAD_MAX_COMPLETIONS
from workers.settings import DEFAULT_SERVER_DOWN_RETRY_S
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.redis_client import connect
from workers.state.runs import decode_run_settings

README_WORKER_ENV = {  # over FAST_WORKER_ENV: the README's defaults, for scenarios that must hold as shipped
    "DRAFTGEN_UPLOAD_MAX_AGE_S": str(DEFAULT_UPLOAD_MAX_AGE_S),
    "DRAFTGEN_UPLOAD_MAX_COMPLETIONS": str(DEFAULT_UPLOAD_MAX_COMPLETIONS),
    "DRAFTGEN_SERVER_DOWN_RETRY_S": str(DEFAULT_SERVER_DOWN_RETRY_S),
    "DRAFTGEN_BACKOFF_BASE_S": str(DEFAULT_BACKOFF_BASE_S),
    "DRAFTGEN_BACKOFF_CAP_S": str(DEFAULT_BACKOFF_CAP_S),
    "DRAFTGEN_REQUEST_TIMEOUT_S": str(DEFAULT_REQUEST_TIMEOUT_S),
}
FAST_WORKER_ENV = {
    "DRAFTGEN_UPLOAD_MAX_AGE_S": "1",
    "DRAFTGEN_UPLOAD_MAX_COMPLETIONS": "100",
    "DRAFTGEN_SERVER_DOWN_RETRY_S": "1",
    "DRAFTGEN_BACKOFF_BASE_S": "0.05",
    "DRAFTGEN_BACKOFF_CAP_S": "0.5",
    "DRAFTGEN_REQUEST_TIMEOUT_S": "60",
}


@dataclass
class Stack:
    redis_url: str
    log_dir: Path
    sims: list[SimulatorProcess]
    extra_env: dict[str, str] = field(default_factory=dict)
    generators: list[ManagedProcess] = field(default_factory=list)
    uploader: ManagedProcess | None = None
    uploads_started: int = 0
    malformed_sent: bool = False  # a test that pushes malformed messages expects some parked
    fast: bool = True  # FAST_WORKER_ENV; False: the workers run with the README's defaults
    gpu_env: dict[int, dict[str, str]] = field(default_factory=dict)  # one GPU's worker's own variables

    def env(self, **extra: str) -> dict[str, str]:
        fast = FAST_WORKER_ENV if self.fast else {}
        return worker_env(self.redis_url, {**fast, **self.extra_env, **extra})

    def start_generator(self, gpu: int) -> ManagedProcess:
        sim = self.sims[gpu]
        env = self.env(DRAFTGEN_SERVER_URL=sim.url, DRAFTGEN_GPU=str(gpu), **self.gpu_env.get(gpu, {}))
        worker = start_celery_worker(f"gen{gpu}-{len(self.generators)}", "generate", env, self.log_dir)
        self.generators.append(worker)
        return worker

    def start_uploader(self) -> ManagedProcess:
        self.uploads_started += 1
        name = f"upload{self.uploads_started}"
        self.uploader = start_celery_worker(name, "upload", self.env(), self.log_dir, concurrency=1)
        return self.uploader

    def start(self) -> Self:
        for gpu in range(len(self.sims)):
            self.start_generator(gpu)
        self.start_uploader()
        return self

    def stop(self) -> None:
        for process in [*self.generators, *([self.uploader] if self.uploader else [])]:
            process.kill()

    def producer(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "producer", *args],
            cwd=PROJECT_ROOT,
            env={**os.environ, **self.env(), **env},
            capture_output=True,
            text=True,
            check=False,
        )

    def enqueue(self, data: Path | str, run: str, *options: str) -> str:
        result = self.producer("enqueue", str(data), "--run", run, *options)
        assert result.returncode == 0, result.stderr + result.stdout
        return result.stdout

    def wait_finished(self, run: str, *, timeout_s: float = 120) -> None:
        ledger = RunLedger(connect(self.redis_url), run)

        def finished() -> bool:
            counts = ledger.counts()
            committed = counts.staged == 0 and counts.dead_pending == 0
            return counts.enqueued > 0 and counts.remaining == 0 and committed

        try:
            wait_until(finished, timeout_s=timeout_s, what=f"run {run} to finish")
        except TimeoutError as error:
            logs = "\n".join(
                f"--- {p.name}\n{p.log_tail()}"
                for p in [*self.generators, *([self.uploader] if self.uploader else [])]
            )
            raise AssertionError(f"{error}: {ledger.counts()}\n{logs}") from error
        self.assert_none_of_ours_parked()

    def assert_none_of_ours_parked(self) -> None:
        """draftgen's own messages are never parked: a check too strict would park them, and the reconciler
        would hide it (it dispatches a batch whose message is gone again, a minute later)."""
        client = connect(self.redis_url)
        if not self.malformed_sent and parked_counts(client):
            raise AssertionError(f"messages parked as malformed: {recent_parked(client, limit=5)}")

    def verify(self, run: str) -> subprocess.CompletedProcess[str]:
        return self.producer("verify", "--run", run)

    def committed_rows(self, run: str) -> list[dict[str, Any]]:
        """Every row of the run's committed Parquet objects (those its manifest lists)."""
        settings = decode_run_settings(connect(self.redis_url).get(RunKeys(run).settings))
        store = open_store(settings.output)
        rows: list[dict[str, Any]] = []
        for key in completion_keys(read_manifest(store)):
            rows.extend(pq.read_table(io.BytesIO(store.get(key))).to_pylist())
        return rows


def deployed_server(**settings: Any) -> SimulatorSettings:
    """A simulated SGLang as `python -m node serve` starts one (the README's deployment, and the demo's): its
    metrics on (the liveness watch reads them), its output chunked by serve's --stream-interval, not
    SGLang's bare default of a chunk a token (which costs the server and the worker ~30 times the chunks);
    `settings` over these."""
    return SimulatorSettings(**{"enable_metrics": True, "stream_interval": SERVE_STREAM_INTERVAL, **settings})


def simulators(count: int, **settings: Any) -> list[SimulatorProcess]:
    """Simulated GPUs as deployed (`deployed_server`), started."""
    return [SimulatorProcess(deployed_server(**settings)).start() for _ in range(count)]


@contextmanager
def simulators_running(count: int, **settings: object) -> Iterator[list[SimulatorProcess]]:
    """`simulators`, stopped when the block ends (a fixture's yield)."""
    running = simulators(count, **settings)
    try:
        yield running
    finally:
        for sim in running:
            sim.stop()
