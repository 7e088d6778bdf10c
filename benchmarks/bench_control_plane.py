"""Control-plane ceiling: completions/s through Redis, generate workers and the uploader when the
server answers at once (a simulator with tiny outputs and a huge speedup), on this machine's cores.

It also says how far one Redis carries a fleet. Redis's own CPU per completion (its user + system
CPU over the run, and the command time `INFO commandstats` counts: enqueue, lease, stage, commit,
heartbeats, events, Celery's messages, everything) gives the completions/s one Redis core serves, and
so the GPUs it serves at the seeds' rate of 0.8 completions/s per GPU. Redis memory left per prompt
once the run is committed (its `done` set and the rest) gives the ceiling in prompts on a 64 GB Redis;
the run's ids (with the fingerprints of explicit ids) are reported apart: their 65,536 hashes cost a
fixed amount that only a big run spreads.

    .venv/bin/python benchmarks/bench_control_plane.py [--prompts 6000] [--workers 2] [--replica]

Last line: control_plane_cps=<committed completions per second, enqueue end to last commit>.

--replica: the durability of a Sentinel group (deploy/multi-node.md, section 6) side by side with one
server's, in one run: the same run again with a replica following the primary (asynchronous
replication, as draftgen uses it), then what `WAIT 1` would add to each write it followed (measured on
the same pair: a write alone, and a write then WAIT), and so per completion at the protocol's hops.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.records import Message, Prompt, SamplingSettings
from core.run_settings.model import RunSettings
from devstack.local_stack import (
    LOCAL_REDIS_HOST,
    REDIS_AUTH_CONF,
    RedisProcess,
    free_port,
    start_celery_worker,
    start_redis,
    wait_until,
    worker_env,
)
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
WAIT_PROBES = 3000
WAIT_TIMEOUT_MS = 1000
PROBE_VALUE_BYTES = 4096  # a batch's hand-over is a few KB
REPLICA_SYNC_S = 30.0
BATCH_SIZE = 16  # the README's default: one hand-over per batch


def redis_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def command_time_us(client: redis.Redis) -> tuple[float, dict[str, float]]:
    """Total microseconds Redis spent in commands, and the five costliest commands."""
    stats = client.info("commandstats")
    per_command = {name.removeprefix("cmdstat_"): float(fields["usec"]) for name, fields in stats.items()}
    top = dict(sorted(per_command.items(), key=lambda item: -item[1])[:5])
    return sum(per_command.values()), top


def data_memory(client: redis.Redis) -> int:
    """Redis's memory in use but for replication's fixed buffers (its backlog, its replicas' output)."""
    memory = client.info("memory")
    replication = int(memory.get("mem_replication_backlog", 0)) + int(memory.get("mem_clients_slaves", 0))
    return int(memory["used_memory"]) - replication


def start_replica(primary: RedisProcess, primary_dir: Path, folder: Path) -> RedisProcess:
    """A redis-server following `primary`, with its password, in sync before it returns."""
    folder.mkdir(parents=True)
    shutil.copy(primary_dir / REDIS_AUTH_CONF, folder / REDIS_AUTH_CONF)  # one password for both
    replica = start_redis(free_port(), folder, folder)
    client = redis.Redis.from_url(replica.url)
    client.config_set("masterauth", primary.password)
    client.replicaof(LOCAL_REDIS_HOST, primary.port)
    wait_until(
        lambda: client.info("replication").get("master_link_status") == "up",
        timeout_s=REPLICA_SYNC_S,
        what="the replica in sync",
    )
    return replica


def wait_cost_us(client: redis.Redis) -> tuple[float, float]:
    """Microseconds of a 4 KB write alone, and of the same write followed by `WAIT 1`, on a primary with
    one replica: the mean of WAIT_PROBES each, interleaved."""
    value = b"x" * PROBE_VALUE_BYTES
    alone = waited = 0.0
    for probe in range(WAIT_PROBES):
        started = time.perf_counter()
        client.set(f"bench:wait:{probe}", value)
        alone += time.perf_counter() - started
        started = time.perf_counter()
        client.set(f"bench:wait:{probe}", value)
        acknowledged = client.wait(1, WAIT_TIMEOUT_MS)
        waited += time.perf_counter() - started
        assert acknowledged == 1, "the replica did not acknowledge"
    client.delete(*(f"bench:wait:{probe}" for probe in range(WAIT_PROBES)))
    return alone * US_PER_S / WAIT_PROBES, waited * US_PER_S / WAIT_PROBES


@dataclass(frozen=True)
class RunFigures:
    enqueue_s: float
    run_s: float
    cpu_used_s: float
    replica_cpu_s: float
    command_us: float
    top_commands: dict[str, float]
    memory_left: int
    id_bytes: int
    wait_us: tuple[float, float] | None


def run_once(prompts: list[Prompt], workers: int, with_replica: bool) -> RunFigures:
    sim_settings = SimulatorSettings(
        speedup=INSTANT_SPEEDUP,
        thinking_tokens_mean=TINY_THINKING_TOKENS,
        answer_tokens_mean=TINY_ANSWER_TOKENS,
        max_running_requests=1024,
        request_log_size=1,
    )
    # One server per generate worker, as on a fleet: a worker takes its server's seat (recovery/seat.py).
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as servers:
        sims = [servers.enter_context(SimulatorProcess(sim_settings)) for _ in range(workers)]
        logs = Path(scratch)
        redis_process = start_redis(free_port(), logs / "redis", logs)
        replica = start_replica(redis_process, logs / "redis", logs / "replica") if with_replica else None
        redis_url = redis_process.url
        client = redis.Redis.from_url(redis_url)
        replica_client = redis.Redis.from_url(replica.url) if replica else None
        started = [
            start_celery_worker(
                f"cp{i}", "generate", worker_env(redis_url, {"DRAFTGEN_SERVER_URL": sim.url}), logs
            )
            for i, sim in enumerate(sims)
        ]
        started.append(start_celery_worker("cp-up", "upload", worker_env(redis_url), logs, concurrency=1))
        try:
            settings = RunSettings(
                run="cp", sampling=SamplingSettings(max_tokens=256), output=(logs / "out").as_uri()
            )
            client.config_resetstat()
            cpu_before = redis_cpu_s(client)
            replica_cpu_before = redis_cpu_s(replica_client) if replica_client else 0.0
            memory_before = data_memory(client)
            enqueue_started = time.monotonic()
            enqueue_run(client, redis_url, settings, prompts)
            enqueued = time.monotonic()
            ledger = RunLedger(client, "cp")
            wait_until(
                lambda: ledger.counts().done == len(prompts), timeout_s=RUN_TIMEOUT_S, what="every commit"
            )
            finished = time.monotonic()
            cpu_used_s = redis_cpu_s(client) - cpu_before
            replica_cpu_s = redis_cpu_s(replica_client) - replica_cpu_before if replica_client else 0.0
            command_us, top_commands = command_time_us(client)
            memory_left = data_memory(client) - memory_before
            # a fixed cost per bucket that a small run cannot spread: reported apart
            id_bytes = memory_by_prefix(client, {RunKeys("cp").ids_prefix: RUN_IDS}).get(RUN_IDS, 0)
        finally:
            for worker in started:
                worker.stop()
        wait_us = wait_cost_us(client) if replica else None
        redis_process.stop()
        if replica:
            replica.stop()
    return RunFigures(
        enqueue_s=enqueued - enqueue_started,
        run_s=finished - enqueue_started,
        cpu_used_s=cpu_used_s,
        replica_cpu_s=replica_cpu_s,
        command_us=command_us,
        top_commands=top_commands,
        memory_left=memory_left,
        id_bytes=id_bytes,
        wait_us=wait_us,
    )


def report(figures: RunFigures, count: int, workers: int, label: str) -> None:
    print(
        f"[{label}] {count} prompts, {workers} generate workers + 1 uploader, instant server, "
        f"enqueue {figures.enqueue_s:.1f} s, last commit after {figures.run_s:.1f} s"
    )
    cpu_us = figures.cpu_used_s * US_PER_S / count
    per_core_cps = US_PER_S / cpu_us
    gpus = per_core_cps / COMPLETIONS_PER_S_PER_GPU
    costliest = ", ".join(f"{name} {us / count:.0f} us" for name, us in figures.top_commands.items())
    print(f"Redis CPU per completion  {cpu_us:.0f} us (user + system)")
    print(f"  in commands             {figures.command_us / count:.0f} us; costliest: {costliest}")
    print(f"one Redis core serves     {per_core_cps:,.0f} completions/s = {gpus:,.0f} GPUs at 0.8/s each")
    per_prompt = (figures.memory_left - figures.id_bytes) / count
    print(
        f"Redis memory per committed prompt {per_prompt:.0f} bytes, the run's ids apart: "
        f"1M prompts {per_prompt * MILLION / 2**20:,.0f} MiB, "
        f"10M {per_prompt * 10 * MILLION / 2**30:.1f} GiB, "
        f"64 GB hold {REDIS_MEMORY_BYTES / per_prompt / MILLION:,.0f}M"
    )
    print(
        f"  + the run's ids, with the fingerprints of explicit ids, {figures.id_bytes / count:.0f} bytes "
        f"each here ({ID_BUCKETS:,} hashes, sparse at this size; benchmarks/bench_enqueue.py measures them "
        "at 1M)"
    )
    if figures.wait_us is not None:
        alone, waited = figures.wait_us
        print(
            f"the replica's own CPU per completion {figures.replica_cpu_s * US_PER_S / count:.0f} us; "
            f"a 4 KB write {alone:.0f} us alone, {waited:.0f} us followed by WAIT 1: WAIT adds "
            f"{waited - alone:.0f} us a write here (loopback), one network round trip between hosts; "
            f"after each batch's hand-over ({BATCH_SIZE} completions) that is "
            f"{(waited - alone) / BATCH_SIZE:.1f} us a completion here"
        )
    print(f"redis_us_per_completion={cpu_us:.0f} fleet_gpus_per_redis_core={gpus:.0f}")
    print(f"control_plane_cps={count / figures.run_s:.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=6000)
    parser.add_argument("--workers", type=int, default=2, help="generate workers sharing the one server")
    parser.add_argument(
        "--replica", action="store_true", help="also the same run with a replica following the primary"
    )
    args = parser.parse_args()
    prompts = [
        Prompt(id=f"c{i}", messages=[Message(role="user", content=f"q {i}")]) for i in range(args.prompts)
    ]
    alone = run_once(prompts, args.workers, with_replica=False)
    report(alone, args.prompts, args.workers, "one server")
    if args.replica:
        replicated = run_once(prompts, args.workers, with_replica=True)
        report(replicated, args.prompts, args.workers, "primary + replica")
        cpu_ratio = replicated.cpu_used_s / alone.cpu_used_s
        cps_ratio = alone.run_s / replicated.run_s
        print(f"with a replica: the primary's Redis CPU x{cpu_ratio:.2f}, completions/s x{cps_ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
