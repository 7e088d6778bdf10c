"""Chaos: one run with the default worker settings under a seeded schedule of crashes and outages,
counted independently from the committed output.

Real processes: redis-server (deploy/redis.conf, AOF) in a temporary folder, N simulated GPUs (metrics
on), one generate worker per GPU, the uploader, and moto's S3 server over HTTP. The workers reach S3
through a TCP proxy this script switches off and on (an S3 outage); the producer and the counting talk
to moto directly. Workers get only what a user must set (DRAFTGEN_REDIS_URL, DRAFTGEN_SERVER_URL,
DRAFTGEN_GPU, AWS_*): every other DRAFTGEN_* setting is the README's default.

Faults (`--faults`, comma-separated; all by default), at seeded moments inside the fault window:
  kill-generate   SIGKILL a generate worker's process group, restart it after --restart-delay-s
  term-generate   SIGTERM a generate worker (warm shutdown), restart it once it has exited
  kill-uploader   SIGKILL the uploader, restart it after --restart-delay-s
  redis-restart   SIGTERM redis-server (a graceful shutdown), start it again on the same port and data
  s3-outage       the proxy resets new connections and drops open ones for --s3-outage-s, stretched
                  until it has refused S3 requests for 10 s (at most 4x): the uploader writes rarely
  server-errors   the simulators answer --error-rate of chat requests with HTTP 500, all through the window
  server-hangs    the simulators never answer --hang-rate of chat requests, all through the window

Counting reads the output's manifest/ entries from S3 with boto3, the prompt ids of each listed Parquet
object with pyarrow, and the run's dead letters from Redis. The run is finished when every input id is
committed or dead-lettered; after --timeout-s it gives up, prints what is missing and where it sits.
A worker that exits on its own is restarted after --restart-delay-s, as the systemd units do
(Restart=always), and counted as unexpected_exits. last_fault_to_end_s runs from the moment the last
injected fault ended (its process restarted, the outage over, the server faults cleared; 0 if one was
still going) to the end;
wasted counts successful generations at the simulators beyond one per prompt.

    .venv/bin/python benchmarks/chaos.py --prompts 3000 --gpus 2 [--speedup 10] [--seed 0] [--json out.json]

Last line: chaos prompts=… committed=… dead=… lost=… duplicated=… orphans=… wasted=… faults=…/…
last_fault_to_end_s=… wall_s=… result=ok|FAILED. Exit status 0 only for a finished run with nothing
lost, nothing duplicated and nothing both committed and dead-lettered.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import io
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import boto3
import pyarrow.parquet as pq
import redis
from moto.server import ThreadedMotoServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fault_proxy import LOCALHOST, FaultProxy
from devstack.local_stack import (
    PROJECT_ROOT,
    ManagedProcess,
    RedisProcess,
    free_port,
    start_celery_worker,
    start_redis,
    worker_env,
)
from inference.simulator import SimulatorProcess, SimulatorSettings
from workers.broker.kombu_layout import waiting_messages
from workers.state.keys import RunKeys

# Fault kinds, as spelled in --faults.
KILL_GENERATE = "kill-generate"
TERM_GENERATE = "term-generate"
KILL_UPLOADER = "kill-uploader"
REDIS_RESTART = "redis-restart"
S3_OUTAGE = "s3-outage"
SERVER_ERRORS = "server-errors"
SERVER_HANGS = "server-hangs"
FAULT_KINDS = (
    KILL_GENERATE,
    TERM_GENERATE,
    KILL_UPLOADER,
    REDIS_RESTART,
    S3_OUTAGE,
    SERVER_ERRORS,
    SERVER_HANGS,
)
# Events that end a fault started by another one (they are not counted as faults).
S3_RESTORE = "s3-restore"
SERVER_FAULTS_OFF = "server-faults-off"
SERVER_FAULTS_ON = "server-faults-on"
UNEXPECTED_EXIT = "unexpected-exit"  # not a fault: a worker that died by itself

DEFAULT_PROMPTS = 3000
DEFAULT_GPUS = 2
DEFAULT_SPEEDUP = 10.0  # 3,000 prompts keep 2 simulated GPUs busy ~150 s without faults
DEFAULT_KILL_GENERATE = 3
DEFAULT_TERM_GENERATE = 1
DEFAULT_KILL_UPLOADER = 1
DEFAULT_REDIS_RESTARTS = 1
DEFAULT_S3_OUTAGE_S = 30.0
DEFAULT_ERROR_RATE = 0.02
DEFAULT_HANG_RATE = 0.005
DEFAULT_FAULT_START_S = 15.0
DEFAULT_FAULT_WINDOW_S = 120.0
DEFAULT_RESTART_DELAY_S = 5.0
DEFAULT_REDIS_DOWN_S = 2.0
DEFAULT_TERM_DEADLINE_S = 120.0  # a SIGTERMed worker still alive after this is SIGKILLed (and noted)
DEFAULT_SETTLE_S = 10.0  # after the run is finished: time for a late duplicate commit to show up
DEFAULT_TIMEOUT_S = 1800.0  # above DRAFTGEN_REQUEST_TIMEOUT_S (1200 s): the longest a hung request lasts

POLL_INTERVAL_S = 1.0
PROGRESS_LOG_INTERVAL_S = 10.0
S3_OUTAGE_AFTER_FIRST_REFUSAL_S = 10.0  # an outage lasts at least this long after it refused a connection
S3_OUTAGE_MAX_STRETCH = 4  # ... unless nothing reached S3 within this many times --s3-outage-s
POSTPONE_S = 1.0  # a fault whose target is down (restarting) waits this long and tries again
ENQUEUE_TIMEOUT_S = 300.0
REDIS_SOCKET_TIMEOUT_S = 2.0
REQUEST_LOG_SLACK = 4  # simulator request-log records kept per prompt (retries, regenerations)
MIN_REQUEST_LOG_SIZE = 100_000
MISSING_SAMPLE_SIZE = 10

RUN_NAME = "chaos"
BUCKET = "draftgen-chaos"
OUTPUT_PREFIX = "runs/chaos"
MANIFEST_DIR = "manifest/"
DATA_DIR = "data/"
DEAD_DIR = "dead/"
MANIFEST_KEY_FIELD = "key"  # an entry's Parquet object of completions (null: dead letters only)
MANIFEST_DEAD_FIELD = "dead"  # an entry's JSONL object of dead letters: {"key": ..., "count": ...} or null
PROMPT_ID_COLUMN = "prompt_id"
GENERATE_QUEUE = "generate"  # kombu: one Redis list per queue, named after it
UPLOAD_QUEUE = "upload"
KOMBU_UNACKED_KEY = "unacked"  # kombu's hash of delivered, unacknowledged messages: {tag: [msg, exch, key]}
KOMBU_UNACKED_INDEX_KEY = "unacked_index"
WERKZEUG_LOGGER = "werkzeug"
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
# Worker settings a user sets for every run; anything else under DRAFTGEN_ inherited would bend the defaults.
USER_SETTINGS = frozenset({"DRAFTGEN_REDIS_URL", "DRAFTGEN_SERVER_URL", "DRAFTGEN_GPU"})

Log = Callable[[str], None]


class ChaosSetupError(RuntimeError):
    """The scenario cannot run as asked (bad options, inherited settings that would bend the defaults)."""


@dataclass(frozen=True)
class ChaosConfig:
    prompts: int = DEFAULT_PROMPTS
    gpus: int = DEFAULT_GPUS
    speedup: float = DEFAULT_SPEEDUP
    seed: int = 0
    faults: frozenset[str] = frozenset(FAULT_KINDS)
    kill_generate: int = DEFAULT_KILL_GENERATE
    term_generate: int = DEFAULT_TERM_GENERATE
    kill_uploader: int = DEFAULT_KILL_UPLOADER
    redis_restarts: int = DEFAULT_REDIS_RESTARTS
    s3_outage_s: float = DEFAULT_S3_OUTAGE_S
    error_rate: float = DEFAULT_ERROR_RATE
    hang_rate: float = DEFAULT_HANG_RATE
    fault_start_s: float = DEFAULT_FAULT_START_S
    fault_window_s: float = DEFAULT_FAULT_WINDOW_S
    restart_delay_s: float = DEFAULT_RESTART_DELAY_S
    redis_down_s: float = DEFAULT_REDIS_DOWN_S
    term_deadline_s: float = DEFAULT_TERM_DEADLINE_S
    settle_s: float = DEFAULT_SETTLE_S
    timeout_s: float = DEFAULT_TIMEOUT_S

    def problems(self) -> list[str]:
        found = [f"unknown fault kind {kind!r}" for kind in sorted(self.faults - set(FAULT_KINDS))]
        if self.prompts < 1 or self.gpus < 1:
            found.append("--prompts and --gpus must be at least 1")
        if not 0 <= self.error_rate + self.hang_rate <= 1:
            found.append("--error-rate + --hang-rate must be in [0, 1]")
        if self.s3_outage_s > self.fault_window_s and S3_OUTAGE in self.faults:
            found.append("--s3-outage-s must fit in --fault-window-s")
        return found


# ---------------------------------------------------------------------------------------------- schedule


@dataclass(frozen=True, order=True)
class Event:
    at_s: float  # seconds after the run was enqueued
    kind: str
    gpu: int = 0


def _discrete_events(config: ChaosConfig, moment: Callable[[], float], gpu: Callable[[], int]) -> list[Event]:
    counts = {
        KILL_GENERATE: config.kill_generate,
        TERM_GENERATE: config.term_generate,
        KILL_UPLOADER: config.kill_uploader,
        REDIS_RESTART: config.redis_restarts,
    }
    return [
        Event(moment(), kind, gpu())
        for kind, count in counts.items()
        if kind in config.faults
        for _ in range(count)
    ]


def plan_faults(config: ChaosConfig) -> list[Event]:
    """The seeded schedule: the same config and seed give the same events."""
    rng = random.Random(config.seed)
    start, window = config.fault_start_s, config.fault_window_s
    events = _discrete_events(
        config, lambda: start + rng.uniform(0, window), lambda: rng.randrange(config.gpus)
    )
    if S3_OUTAGE in config.faults and config.s3_outage_s > 0:
        down = start + rng.uniform(0, window - config.s3_outage_s)
        events += [Event(down, S3_OUTAGE), Event(down + config.s3_outage_s, S3_RESTORE)]
    if server_fault_rates(config) != (0.0, 0.0):
        events += [Event(start, SERVER_FAULTS_ON), Event(start + window, SERVER_FAULTS_OFF)]
    return sorted(events)


def server_fault_rates(config: ChaosConfig) -> tuple[float, float]:
    """(error_rate, hang_rate) injected at the simulators during the fault window."""
    errors = config.error_rate if SERVER_ERRORS in config.faults else 0.0
    hangs = config.hang_rate if SERVER_HANGS in config.faults else 0.0
    return errors, hangs


# Events that start a fault (the others end one): what `faults=injected/planned` counts.
FAULT_STARTING_EVENTS = frozenset(
    {KILL_GENERATE, TERM_GENERATE, KILL_UPLOADER, REDIS_RESTART, S3_OUTAGE, SERVER_FAULTS_ON}
)


def planned_fault_count(events: Iterable[Event]) -> int:
    return sum(1 for event in events if event.kind in FAULT_STARTING_EVENTS)


# ---------------------------------------------------------------------------------------------- processes


def aws_env(endpoint_url: str) -> dict[str, str]:
    return {**FAKE_AWS_ENV, "AWS_ENDPOINT_URL": endpoint_url}


@dataclass
class Pipeline:
    """Every process of the run; `close` takes down whatever was started, dead or alive."""

    config: ChaosConfig
    logs: Path
    redis_port: int
    redis_data: Path
    moto_url: str = ""
    proxy: FaultProxy | None = None
    redis: RedisProcess | None = None
    sims: list[SimulatorProcess] = field(default_factory=list)
    generators: dict[int, ManagedProcess] = field(default_factory=dict)
    uploader: ManagedProcess | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    starts: Counter[str] = field(default_factory=Counter)

    @property
    def redis_url(self) -> str:
        assert self.redis is not None, "redis-server was never started"
        return self.redis.url  # with its password, kept beside its data across restarts

    def worker_aws_env(self) -> dict[str, str]:
        assert self.proxy is not None
        return aws_env(self.proxy.url)

    def _named(self, role: str) -> str:
        self.starts[role] += 1
        return f"{role}-{self.starts[role]}"

    def start_redis(self) -> None:
        name = self._named("redis")
        self.redis = start_redis(self.redis_port, self.redis_data, self.logs / name)
        self.processes.append(self.redis)

    def restart_redis(self) -> int | None:
        """SIGTERM (redis-server shuts down gracefully, the AOF fsynced), wait, start again; its exit code."""
        assert self.redis is not None
        self.redis.stop()
        code = self.redis.process.returncode if self.redis.process else None
        time.sleep(self.config.redis_down_s)
        self.start_redis()
        return code

    def start_generator(self, gpu: int) -> ManagedProcess:
        sim = self.sims[gpu]
        env = worker_env(
            self.redis_url,
            {"DRAFTGEN_SERVER_URL": sim.url, "DRAFTGEN_GPU": str(gpu), **self.worker_aws_env()},
        )
        worker = start_celery_worker(self._named(f"gen{gpu}"), GENERATE_QUEUE, env, self.logs)
        self.processes.append(worker)
        self.generators[gpu] = worker
        return worker

    def start_uploader(self) -> ManagedProcess:
        env = worker_env(self.redis_url, self.worker_aws_env())
        self.uploader = start_celery_worker(
            self._named("upload"), UPLOAD_QUEUE, env, self.logs, concurrency=1
        )
        self.processes.append(self.uploader)
        return self.uploader

    def producer_env(self) -> dict[str, str]:
        return {**os.environ, **worker_env(self.redis_url, aws_env(self.moto_url))}

    def close(self) -> None:
        for process in reversed(self.processes):
            process.kill()
        for gpu, sim in enumerate(self.sims):
            with contextlib.suppress(OSError):
                (self.logs / f"sim{gpu}.log").write_text(sim.log_text())
            sim.close()
        if self.proxy is not None:
            self.proxy.close()


def start_simulators(config: ChaosConfig, pipeline: Pipeline) -> None:
    log_size = max(MIN_REQUEST_LOG_SIZE, config.prompts * REQUEST_LOG_SLACK)
    for gpu in range(config.gpus):
        settings = SimulatorSettings(
            enable_metrics=True, speedup=config.speedup, seed=config.seed + gpu, request_log_size=log_size
        )
        sim = SimulatorProcess(settings)
        pipeline.sims.append(sim)  # before start: close() then takes it down even if start fails
        sim.start()


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    logging.getLogger(WERKZEUG_LOGGER).setLevel(logging.ERROR)  # moto's server logs every request
    server = ThreadedMotoServer(ip_address=LOCALHOST, port=free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint_url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=FAKE_AWS_ENV["AWS_DEFAULT_REGION"],
    )


def check_inherited_settings(environ: Mapping[str, str]) -> None:
    bending = sorted(name for name in environ if name.startswith("DRAFTGEN_") and name not in USER_SETTINGS)
    if bending:
        raise ChaosSetupError(
            "the chaos run uses the default worker settings, but this environment sets "
            f"{', '.join(bending)}: unset them"
        )


# ---------------------------------------------------------------------------------------------- faults


@dataclass
class FaultRecord:
    kind: str
    target: str
    started_s: float
    ended_s: float | None = None  # back to normal: restarted, restored, cleared
    note: str = ""


@dataclass
class PendingRestart:
    gpu: int | None  # None: the uploader
    process: ManagedProcess
    record: FaultRecord
    not_before_s: float
    escalate_at_s: float | None = None  # SIGTERM: SIGKILL it if still alive then
    exited_s: float | None = None


class FaultRunner:
    """Executes the schedule's due events and restarts what it took down, between two polls."""

    def __init__(self, pipeline: Pipeline, events: list[Event], clock: Callable[[], float], log: Log) -> None:
        self.pipeline = pipeline
        self.config = pipeline.config
        self.planned = planned_fault_count(events)
        self.records: list[FaultRecord] = []  # the injected faults
        self.exits: list[FaultRecord] = []  # workers that died by themselves (restarted like systemd would)
        self._queue = list(events)
        heapq.heapify(self._queue)
        self._pending: list[PendingRestart] = []
        self._open: dict[str, FaultRecord] = {}  # outage and server faults, until restored
        self._clock = clock
        self._log = log
        self._handlers: dict[str, Callable[[Event], None]] = {
            KILL_GENERATE: self._kill_generate,
            TERM_GENERATE: self._term_generate,
            KILL_UPLOADER: self._kill_uploader,
            REDIS_RESTART: self._restart_redis,
            S3_OUTAGE: self._s3_down,
            S3_RESTORE: self._s3_up,
            SERVER_FAULTS_ON: self._server_faults_on,
            SERVER_FAULTS_OFF: self._server_faults_off,
        }

    @property
    def injected(self) -> int:
        return len(self.records)

    def last_fault_end_s(self) -> float | None:
        """When the last injected fault ended; one still going (the run finished first) ends now."""
        ends = [record.ended_s if record.ended_s is not None else self._clock() for record in self.records]
        return max(ends, default=None)

    def next_due_s(self) -> float:
        due = [self._queue[0].at_s] if self._queue else []
        # a SIGTERMed worker still shutting down is looked at again at the next poll
        due += [pending.not_before_s for pending in self._pending if not pending.process.alive()]
        return min(due, default=math.inf)

    def step(self) -> None:
        while self._queue and self._queue[0].at_s <= self._clock():
            event = heapq.heappop(self._queue)
            self._handlers[event.kind](event)
        for pending in list(self._pending):
            self._restart_if_due(pending)
        self._supervise()

    def _supervise(self) -> None:
        """Restart a worker that exited on its own after the restart delay, as the systemd units do
        (deploy/systemd: Restart=always, RestartSec=5), and record it: no fault should cause one."""
        restarting = {id(pending.process) for pending in self._pending}
        watched: list[tuple[int | None, ManagedProcess | None]] = [
            *self.pipeline.generators.items(),
            (None, self.pipeline.uploader),
        ]
        for gpu, process in watched:
            if process is None or process.alive() or id(process) in restarting:
                continue
            assert process.process is not None
            now = self._clock()
            target = "uploader" if gpu is None else f"gen{gpu}"
            record = FaultRecord(
                UNEXPECTED_EXIT, target, round(now, 1), note=f"exit code {process.process.returncode}"
            )
            self.exits.append(record)
            self._log(
                f"t={record.started_s:7.1f}s {UNEXPECTED_EXIT} {target} {record.note}, see {process.log_path}"
            )
            self._pending.append(
                PendingRestart(gpu, process, record, now + self.config.restart_delay_s, exited_s=now)
            )

    # -- helpers

    def _record(self, kind: str, target: str, note: str = "") -> FaultRecord:
        record = FaultRecord(kind, target, round(self._clock(), 1), note=note)
        self.records.append(record)
        self._log(f"t={record.started_s:7.1f}s fault {kind} {target} {note}".rstrip())
        return record

    def _end(self, record: FaultRecord, note: str = "") -> None:
        record.ended_s = round(self._clock(), 1)
        record.note = "; ".join(filter(None, [record.note, note]))
        self._log(f"t={record.ended_s:7.1f}s ended {record.kind} {record.target} {note}".rstrip())

    def _postpone(self, event: Event) -> None:
        heapq.heappush(self._queue, Event(self._clock() + POSTPONE_S, event.kind, event.gpu))

    def _restarting_gpus(self) -> set[int]:
        return {pending.gpu for pending in self._pending if pending.gpu is not None}

    def _alive_gpu(self, preferred: int) -> int | None:
        """The preferred GPU's worker, else another running one, else None (every one is restarting)."""
        candidates = [preferred, *sorted(self.pipeline.generators)]
        busy = self._restarting_gpus()
        return next(
            (gpu for gpu in candidates if gpu not in busy and self.pipeline.generators[gpu].alive()), None
        )

    # -- handlers

    def _kill_generate(self, event: Event) -> None:
        gpu = self._alive_gpu(event.gpu)
        if gpu is None:
            self._postpone(event)
            return
        process = self.pipeline.generators[gpu]
        process.kill()
        record = self._record(KILL_GENERATE, f"gen{gpu}", f"pid {process.pid}")
        self._pending.append(
            PendingRestart(
                gpu, process, record, self._clock() + self.config.restart_delay_s, exited_s=self._clock()
            )
        )

    def _term_generate(self, event: Event) -> None:
        gpu = self._alive_gpu(event.gpu)
        if gpu is None:
            self._postpone(event)
            return
        process = self.pipeline.generators[gpu]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        record = self._record(TERM_GENERATE, f"gen{gpu}", f"pid {process.pid}")
        now = self._clock()
        self._pending.append(
            PendingRestart(
                gpu,
                process,
                record,
                now + self.config.restart_delay_s,
                escalate_at_s=now + self.config.term_deadline_s,
            )
        )

    def _kill_uploader(self, event: Event) -> None:
        process = self.pipeline.uploader
        if process is None or not process.alive() or any(p.gpu is None for p in self._pending):
            self._postpone(event)
            return
        process.kill()
        record = self._record(KILL_UPLOADER, "uploader", f"pid {process.pid}")
        self._pending.append(
            PendingRestart(
                None, process, record, self._clock() + self.config.restart_delay_s, exited_s=self._clock()
            )
        )

    def _restart_if_due(self, pending: PendingRestart) -> None:
        now = self._clock()
        if pending.process.alive():
            if pending.escalate_at_s is None or now < pending.escalate_at_s:
                return
            pending.process.kill()
            pending.record.note += (
                f"; still alive {self.config.term_deadline_s:.0f} s after SIGTERM: SIGKILLed"
            )
        if pending.exited_s is None:
            pending.exited_s = now
            pending.record.note += f"; exited after {now - pending.record.started_s:.1f} s"
        if now < pending.not_before_s:
            return
        self._pending.remove(pending)
        if pending.gpu is None:
            self.pipeline.start_uploader()
        else:
            self.pipeline.start_generator(pending.gpu)
        self._end(pending.record, "restarted")

    def _restart_redis(self, event: Event) -> None:
        record = self._record(REDIS_RESTART, "redis")
        code = self.pipeline.restart_redis()
        self._end(record, f"exit code {code}, back after {self._clock() - record.started_s:.1f} s")

    def _s3_down(self, event: Event) -> None:
        assert self.pipeline.proxy is not None
        self.pipeline.proxy.outage(True)
        self._open[S3_OUTAGE] = self._record(S3_OUTAGE, "s3", f"for {self.config.s3_outage_s:.0f} s")

    def _s3_up(self, event: Event) -> None:
        """End the outage once it has lasted its time and met S3 traffic for a while (the uploader
        writes only every minute or so), or at the latest after its stretch."""
        proxy = self.pipeline.proxy
        assert proxy is not None
        record = self._open[S3_OUTAGE]
        hit_at = proxy.first_refused_at
        met = hit_at is not None and time.monotonic() - hit_at >= S3_OUTAGE_AFTER_FIRST_REFUSAL_S
        stretch_over = self._clock() >= record.started_s + S3_OUTAGE_MAX_STRETCH * self.config.s3_outage_s
        if not (met or stretch_over):
            self._postpone(event)
            return
        proxy.outage(False)
        self._open.pop(S3_OUTAGE)
        note = (
            "no S3 request met it" if hit_at is None else f"{proxy.stats.refused} connections refused so far"
        )
        self._end(record, note)

    def _server_faults_on(self, event: Event) -> None:
        errors, hangs = server_fault_rates(self.config)
        for sim in self.pipeline.sims:
            sim.admin.set_faults(error_rate=errors, hang_rate=hangs)
        self._open[SERVER_FAULTS_ON] = self._record(
            "server-faults", "simulators", f"error_rate={errors} hang_rate={hangs}"
        )

    def _server_faults_off(self, event: Event) -> None:
        for sim in self.pipeline.sims:
            sim.admin.clear_faults()
        self._end(self._open.pop(SERVER_FAULTS_ON))


# ---------------------------------------------------------------------------------------------- counting


class OutputCounter:
    """What the output and Redis say, read without the pipeline's code: the manifest entries in S3, the
    prompt ids of the Parquet objects (completions) and JSONL objects (dead letters) they list, and the
    dead letters still only in Redis (a dead letter is committed by a later flush)."""

    def __init__(self, s3: Any, client: redis.Redis, run: str, input_ids: set[str]) -> None:
        self.s3 = s3
        self.client = client
        self.keys = RunKeys(run)
        self.input_ids = input_ids
        self.completions_by_entry: dict[str, list[str]] = {}  # manifest key -> ids of its Parquet object
        self.dead_by_entry: dict[str, list[str]] = {}  # manifest key -> ids of its dead-letter object
        self.listed_keys: set[str] = set()  # the objects the entries name
        self.redis_dead_ids: set[str] = set()

    def _list(self, directory: str) -> list[str]:
        paginator = self.s3.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=BUCKET, Prefix=f"{OUTPUT_PREFIX}/{directory}")
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def _get(self, key: str) -> bytes:
        self.listed_keys.add(key)
        body: bytes = self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return body

    def _completion_ids(self, relative_key: str | None) -> list[str]:
        if not relative_key:
            return []  # a part of dead letters only
        table = pq.read_table(
            io.BytesIO(self._get(f"{OUTPUT_PREFIX}/{relative_key}")), columns=[PROMPT_ID_COLUMN]
        )
        ids: list[str] = table.column(0).to_pylist()
        return ids

    def _dead_ids(self, ref: dict[str, Any] | None) -> list[str]:
        if not ref:
            return []
        lines = self._get(f"{OUTPUT_PREFIX}/{ref['key']}").splitlines()
        return [json.loads(line)[PROMPT_ID_COLUMN] for line in lines if line.strip()]

    def refresh(self) -> None:
        for manifest_key in self._list(MANIFEST_DIR):
            if manifest_key in self.completions_by_entry:
                continue  # entries are created once, never rewritten
            entry = json.loads(self.s3.get_object(Bucket=BUCKET, Key=manifest_key)["Body"].read())
            self.dead_by_entry[manifest_key] = self._dead_ids(entry.get(MANIFEST_DEAD_FIELD))
            self.completions_by_entry[manifest_key] = self._completion_ids(entry.get(MANIFEST_KEY_FIELD))
        with contextlib.suppress(redis.RedisError):  # Redis restarting: keep what was last read
            self.redis_dead_ids = {raw.decode() for raw in self.client.hkeys(self.keys.dead)}

    def committed(self) -> Counter[str]:
        return Counter(prompt_id for ids in self.completions_by_entry.values() for prompt_id in ids)

    def committed_dead(self) -> Counter[str]:
        return Counter(prompt_id for ids in self.dead_by_entry.values() for prompt_id in ids)

    @property
    def dead_ids(self) -> set[str]:
        return set(self.committed_dead()) | self.redis_dead_ids

    def missing(self) -> set[str]:
        return self.input_ids - set(self.committed()) - self.dead_ids

    def duplicated(self) -> list[str]:
        """Ids with two completions, or two committed dead letters."""
        both = (self.committed(), self.committed_dead())
        return sorted({prompt_id for counts in both for prompt_id, count in counts.items() if count > 1})

    def orphans(self) -> list[str]:
        written = set(self._list(DATA_DIR)) | set(self._list(DEAD_DIR))
        return sorted(written - self.listed_keys)


@dataclass(frozen=True)
class Generation:
    gpu: int
    received_at: float  # Unix time, as the simulator logs it
    finished_at: float


@dataclass
class ServerLog:
    """The run's chat requests as the simulators logged them (rids `<run>:<prompt_id>:<hex>`)."""

    ok: dict[str, list[Generation]] = field(default_factory=dict)  # successful generations per prompt id
    statuses: Counter[str] = field(default_factory=Counter)

    def wasted(self) -> int:
        return sum(len(generations) - 1 for generations in self.ok.values())

    def wasted_sample(self, started_at: float) -> list[dict[str, Any]]:
        """The first prompts generated more than once, with when (seconds after enqueue) and where."""
        repeated = sorted(
            (generations for generations in self.ok.items() if len(generations[1]) > 1),
            key=lambda item: min(g.finished_at for g in item[1]),
        )
        return [
            {
                "prompt_id": prompt_id,
                "generations": [
                    f"gpu{g.gpu} {g.received_at - started_at:.1f}-{g.finished_at - started_at:.1f}s"
                    for g in sorted(generations, key=lambda g: g.received_at)
                ],
            }
            for prompt_id, generations in repeated[:MISSING_SAMPLE_SIZE]
        ]


def read_server_logs(sims: list[SimulatorProcess], run: str) -> ServerLog:
    log = ServerLog()
    for gpu, sim in enumerate(sims):
        for record in sim.admin.requests():
            if not record.rid.startswith(run + ":"):
                continue
            log.statuses[record.status] += 1
            if record.status == "ok":
                prompt_id = record.rid[len(run) + 1 :].rpartition(":")[0]
                finished = record.finished_at or record.received_at
                log.ok.setdefault(prompt_id, []).append(Generation(gpu, record.received_at, finished))
    return log


def _queue_view(client: redis.Redis) -> dict[str, Any]:
    held = Counter(json.loads(raw)[2] for raw in client.hvals(KOMBU_UNACKED_KEY))
    return {
        "queue_generate": waiting_messages(client, GENERATE_QUEUE),
        "queue_upload": waiting_messages(client, UPLOAD_QUEUE),
        "unacked_generate": held.get(GENERATE_QUEUE, 0),
        "unacked_upload": held.get(UPLOAD_QUEUE, 0),
        "unacked_index": client.zcard(KOMBU_UNACKED_INDEX_KEY),
    }


def _run_view(client: redis.Redis, keys: RunKeys) -> dict[str, Any]:
    return {
        "enqueued": int(client.get(keys.enqueued_count) or 0),
        "staged": client.hlen(keys.staged),
        "done": client.scard(keys.done),
        "dead": client.hlen(keys.dead),
        "dead_pending": client.zcard(keys.dead_pending),  # dead letters not yet committed to the output
        "leases": client.zcard(keys.leases),
        "open_batches": client.zcard(keys.open_batches),
        "unpublished": client.scard(keys.unpublished),
        "upload_lock_ttl_s": client.ttl(keys.upload_lock),
        "paused": bool(client.exists(keys.paused)),
    }


def _missing_view(client: redis.Redis, keys: RunKeys, missing: list[str]) -> dict[str, int]:
    """Where the missing prompts sit: staged but not committed, marked done but in no manifest entry,
    or neither (never handed over: in a batch nobody is working on)."""
    if not missing:
        return {}
    pipe = client.pipeline()
    pipe.hmget(keys.staged, missing)
    pipe.smismember(keys.done, missing)
    staged, done = pipe.execute()
    in_staged = sum(blob is not None for blob in staged)
    in_done = sum(bool(flag) for flag in done)
    return {
        "staged": in_staged,
        "done_not_in_manifest": in_done,
        "never_handed_over": len(missing) - in_staged - in_done,
    }


def redis_diagnostics(client: redis.Redis, run: str, missing: list[str]) -> dict[str, Any]:
    keys = RunKeys(run)
    try:
        return {
            **_queue_view(client),
            **_run_view(client, keys),
            "missing_in": _missing_view(client, keys, missing),
        }
    except redis.RedisError as error:
        return {"redis_error": str(error)}


# ---------------------------------------------------------------------------------------------- report


@dataclass
class ChaosReport:
    prompts: int
    committed: int = 0  # distinct input ids in committed objects
    dead: int = 0  # input ids dead-lettered (in Redis or in a committed dead-letter object)
    dead_committed: int = 0  # of which in a committed dead-letter object
    lost: int = 0
    duplicated: int = 0  # ids committed more than once
    committed_and_dead: int = 0
    orphans: int = 0
    wasted: int = 0  # successful generations beyond one per prompt
    faults_injected: int = 0
    faults_planned: int = 0
    unexpected_exits: int = 0  # workers that died by themselves and were restarted
    finished: bool = False
    last_fault_to_end_s: float | None = None
    wall_s: float = 0.0  # from enqueue to finished (or to giving up)
    setup_s: float = 0.0
    missing_sample: list[str] = field(default_factory=list)
    duplicated_sample: list[str] = field(default_factory=list)
    wasted_sample: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = 0.0  # Unix time of the enqueue: the zero of every *_s time
    requests_by_status: dict[str, int] = field(default_factory=dict)
    proxy: dict[str, int] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)
    redis: dict[str, Any] = field(default_factory=dict)
    log_dir: str = ""

    @property
    def ok(self) -> bool:
        return self.finished and self.lost == 0 and self.duplicated == 0 and self.committed_and_dead == 0

    def summary_line(self) -> str:
        to_end = "none" if self.last_fault_to_end_s is None else f"{self.last_fault_to_end_s:.1f}"
        return (
            f"chaos prompts={self.prompts} committed={self.committed} dead={self.dead} lost={self.lost} "
            f"duplicated={self.duplicated} committed_and_dead={self.committed_and_dead} "
            f"orphans={self.orphans} "
            f"wasted={self.wasted} faults={self.faults_injected}/{self.faults_planned} "
            f"unexpected_exits={self.unexpected_exits} "
            f"last_fault_to_end_s={to_end} wall_s={self.wall_s:.1f} result={'ok' if self.ok else 'FAILED'}"
        )

    def details(self) -> str:
        """Behind the summary: where missing prompts sit, what Redis holds, the faults, the waste."""
        lines = [f"finished={self.finished} logs={self.log_dir}"]
        if self.missing_sample:
            lines.append(f"missing (first {len(self.missing_sample)}): {' '.join(self.missing_sample)}")
        if self.duplicated_sample:
            lines.append(
                f"duplicated (first {len(self.duplicated_sample)}): {' '.join(self.duplicated_sample)}"
            )
        lines.append(f"redis: {json.dumps(self.redis, sort_keys=True)}")
        lines.append(f"server requests by status: {json.dumps(self.requests_by_status, sort_keys=True)}")
        lines.append(
            f"s3 proxy (refused/dropped during the outage): {json.dumps(self.proxy, sort_keys=True)}"
        )
        lines += [f"wasted: {json.dumps(sample)}" for sample in self.wasted_sample]
        lines += [f"fault: {json.dumps(fault)}" for fault in self.faults]
        lines += [f"{UNEXPECTED_EXIT}: {json.dumps(exit_)}" for exit_ in self.exits]
        return "\n".join(lines)


def final_count(report: ChaosReport, counter: OutputCounter, pipeline: Pipeline, runner: FaultRunner) -> None:
    counter.refresh()
    committed = counter.committed()
    missing = sorted(counter.missing())
    duplicated = counter.duplicated()
    server_log = read_server_logs(pipeline.sims, RUN_NAME)
    report.committed = len(set(committed) & counter.input_ids)
    report.dead = len(counter.dead_ids & counter.input_ids)
    report.dead_committed = len(set(counter.committed_dead()) & counter.input_ids)
    report.lost = len(missing)
    report.duplicated = len(duplicated)
    report.committed_and_dead = len(set(committed) & counter.dead_ids)
    report.orphans = len(counter.orphans())
    report.wasted = server_log.wasted()
    report.wasted_sample = server_log.wasted_sample(report.started_at)
    report.missing_sample = missing[:MISSING_SAMPLE_SIZE]
    report.duplicated_sample = duplicated[:MISSING_SAMPLE_SIZE]
    report.requests_by_status = dict(server_log.statuses)
    report.faults_injected = runner.injected
    report.faults = [asdict(record) for record in runner.records]
    report.unexpected_exits = len(runner.exits)
    report.exits = [asdict(record) for record in runner.exits]
    report.redis = redis_diagnostics(counter.client, RUN_NAME, missing)
    if pipeline.proxy is not None:
        report.proxy = asdict(pipeline.proxy.stats)


# ---------------------------------------------------------------------------------------------- scenario


def write_prompts(path: Path, count: int) -> set[str]:
    ids = [f"chaos-{i}" for i in range(count)]
    with path.open("w") as out:
        for i, prompt_id in enumerate(ids):
            out.write(
                json.dumps({"id": prompt_id, "prompt": f"Chaos question {i}: what is {i} squared, and why?"})
            )
            out.write("\n")
    return set(ids)


def enqueue(pipeline: Pipeline, data: Path) -> None:
    output = f"s3://{BUCKET}/{OUTPUT_PREFIX}"
    result = subprocess.run(
        [sys.executable, "-m", "producer", "enqueue", str(data), "--run", RUN_NAME, "--output", output],
        cwd=PROJECT_ROOT,
        env=pipeline.producer_env(),
        capture_output=True,
        text=True,
        timeout=ENQUEUE_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise ChaosSetupError(f"enqueue failed ({result.returncode}):\n{result.stdout}{result.stderr}")


def start_pipeline(config: ChaosConfig, pipeline: Pipeline) -> None:
    """redis-server, simulators, the proxy in front of S3, one generate worker per GPU, the uploader."""
    pipeline.start_redis()
    start_simulators(config, pipeline)
    host_port = pipeline.moto_url.removeprefix("http://").rsplit(":", 1)
    pipeline.proxy = FaultProxy(host_port[0], int(host_port[1])).start()
    for gpu in range(config.gpus):
        pipeline.start_generator(gpu)
    pipeline.start_uploader()


def progress_line(now_s: float, counter: OutputCounter, runner: FaultRunner, missing: int) -> str:
    line = (
        f"t={now_s:7.1f}s committed={len(counter.committed())} dead={len(counter.dead_ids)} "
        f"missing={missing} faults={runner.injected}/{runner.planned}"
    )
    try:
        queues = _queue_view(counter.client)
        staged = counter.client.hlen(counter.keys.staged)
    except redis.RedisError:
        return line + " redis=unreachable"
    return (
        f"{line} staged={staged} queued={queues['queue_generate']} "
        f"unacked={queues['unacked_generate']}+{queues['unacked_upload']}"
    )


def drive(
    config: ChaosConfig, counter: OutputCounter, runner: FaultRunner, clock: Callable[[], float], log: Log
) -> bool:
    """Run the schedule and poll the output until every prompt is accounted for (True) or the timeout."""
    next_progress_log_s = 0.0
    while True:
        runner.step()
        counter.refresh()
        missing = len(counter.missing())
        now = clock()
        if now >= next_progress_log_s:
            next_progress_log_s = now + PROGRESS_LOG_INTERVAL_S
            log(progress_line(now, counter, runner, missing))
        if missing == 0:
            return True
        if now >= config.timeout_s:
            log(f"t={now:7.1f}s giving up: {missing} prompts neither committed nor dead-lettered")
            return False
        time.sleep(max(0.0, min(POLL_INTERVAL_S, runner.next_due_s() - now)))


def redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
    )


def run_chaos(config: ChaosConfig, work_dir: Path, log: Log = print) -> ChaosReport:
    """The whole scenario; every process it starts is gone when it returns or raises."""
    problems = config.problems()
    if problems:
        raise ChaosSetupError("; ".join(problems))
    check_inherited_settings(os.environ)
    setup_started = time.monotonic()
    logs = work_dir / "logs"
    pipeline = Pipeline(config, logs, free_port(), work_dir / "redis-data")
    with contextlib.ExitStack() as cleanup:
        pipeline.moto_url = cleanup.enter_context(moto_server())
        cleanup.callback(pipeline.close)
        s3 = s3_client(pipeline.moto_url)
        s3.create_bucket(Bucket=BUCKET)
        data = work_dir / "prompts.jsonl"
        input_ids = write_prompts(data, config.prompts)
        start_pipeline(config, pipeline)
        client = cleanup.enter_context(contextlib.closing(redis_client(pipeline.redis_url)))
        counter = OutputCounter(s3, client, RUN_NAME, input_ids)
        report = ChaosReport(
            prompts=config.prompts, log_dir=str(logs), setup_s=round(time.monotonic() - setup_started, 1)
        )
        run_scenario(pipeline, counter, data, report, log)
    return report


def run_scenario(
    pipeline: Pipeline, counter: OutputCounter, data: Path, report: ChaosReport, log: Log
) -> None:
    """Enqueue, inject the faults on schedule until every prompt is accounted for or the timeout, count."""
    config = pipeline.config
    started = time.monotonic()
    report.started_at = time.time()

    def clock() -> float:
        return time.monotonic() - started

    runner = FaultRunner(pipeline, plan_faults(config), clock, log)
    report.faults_planned = runner.planned
    enqueue(pipeline, data)
    report.finished = drive(config, counter, runner, clock, log)
    report.wall_s = round(clock(), 1)
    last_end = runner.last_fault_end_s()
    if report.finished and last_end is not None:
        report.last_fault_to_end_s = round(max(0.0, report.wall_s - last_end), 1)
    if report.finished:
        time.sleep(config.settle_s)  # a late commit of a prompt already counted would show up as a duplicate
    final_count(report, counter, pipeline, runner)


# ---------------------------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--prompts", type=int, default=DEFAULT_PROMPTS)
    add("--gpus", type=int, default=DEFAULT_GPUS, help="simulated GPUs, one generate worker each")
    add("--speedup", type=float, default=DEFAULT_SPEEDUP, help="the simulators' time speedup")
    add("--seed", type=int, default=0, help="seeds the fault schedule and the simulators")
    add("--faults", default=",".join(FAULT_KINDS), help="comma-separated kinds to inject ('' for none)")
    add("--kill-generate", type=int, default=DEFAULT_KILL_GENERATE, help="SIGKILLs of generate workers")
    add("--term-generate", type=int, default=DEFAULT_TERM_GENERATE, help="SIGTERMs of generate workers")
    add("--kill-uploader", type=int, default=DEFAULT_KILL_UPLOADER, help="SIGKILLs of the uploader")
    add("--redis-restarts", type=int, default=DEFAULT_REDIS_RESTARTS)
    add("--s3-outage-s", type=float, default=DEFAULT_S3_OUTAGE_S)
    add("--error-rate", type=float, default=DEFAULT_ERROR_RATE, help="HTTP 500s during the fault window")
    add("--hang-rate", type=float, default=DEFAULT_HANG_RATE, help="hung requests during the fault window")
    add("--fault-start-s", type=float, default=DEFAULT_FAULT_START_S, help="after enqueue")
    add("--fault-window-s", type=float, default=DEFAULT_FAULT_WINDOW_S)
    add("--restart-delay-s", type=float, default=DEFAULT_RESTART_DELAY_S)
    add("--redis-down-s", type=float, default=DEFAULT_REDIS_DOWN_S)
    add("--term-deadline-s", type=float, default=DEFAULT_TERM_DEADLINE_S)
    add("--settle-s", type=float, default=DEFAULT_SETTLE_S, help="wait after the end for late duplicates")
    add("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="give up this long after enqueue")
    add("--json", type=Path, help="write the report here")
    add("--work-dir", type=Path, help="keep redis data and logs here (default: a temporary folder)")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ChaosConfig:
    return ChaosConfig(
        prompts=args.prompts,
        gpus=args.gpus,
        speedup=args.speedup,
        seed=args.seed,
        faults=frozenset(kind.strip() for kind in args.faults.split(",") if kind.strip()),
        kill_generate=args.kill_generate,
        term_generate=args.term_generate,
        kill_uploader=args.kill_uploader,
        redis_restarts=args.redis_restarts,
        s3_outage_s=args.s3_outage_s,
        error_rate=args.error_rate,
        hang_rate=args.hang_rate,
        fault_start_s=args.fault_start_s,
        fault_window_s=args.fault_window_s,
        restart_delay_s=args.restart_delay_s,
        redis_down_s=args.redis_down_s,
        term_deadline_s=args.term_deadline_s,
        settle_s=args.settle_s,
        timeout_s=args.timeout_s,
    )


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_chaos's cleanup


def drop_inherited_settings() -> None:
    for name in sorted(os.environ):
        if name.startswith("DRAFTGEN_") and name not in USER_SETTINGS:
            print(
                f"chaos: ignoring {name} from the environment (the run uses the default settings)",
                file=sys.stderr,
            )
            del os.environ[name]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_from_args(args)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    drop_inherited_settings()
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="draftgen-chaos-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = run_chaos(config, work_dir, log=lambda line: print(line, file=sys.stderr, flush=True))
    except ChaosSetupError as error:
        print(f"chaos: {error}", file=sys.stderr)
        return 2
    except BaseException:
        print(f"chaos: aborted; logs and Redis data are in {work_dir}", file=sys.stderr)
        raise
    print(report.details(), file=sys.stderr)
    if args.json:
        args.json.write_text(
            json.dumps({**asdict(report), "ok": report.ok, "config": _config_json(config)}, indent=2)
        )
    print(report.summary_line(), flush=True)
    if report.ok and args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0 if report.ok else 1


def _config_json(config: ChaosConfig) -> dict[str, Any]:
    return {**asdict(config), "faults": sorted(config.faults)}


if __name__ == "__main__":
    raise SystemExit(main())
