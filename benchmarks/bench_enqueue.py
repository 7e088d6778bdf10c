"""Enqueue throughput and footprint: 1M prompts, streamed, into a fresh redis-server.

Reports wall time (the first enqueue and a re-run over the same rows, which finds them all there, side by
side) for each `--processes` value compared (one process, and the default: one per core), the producer's
peak memory at 100k and at the full count, of its largest process and of all (flat means streamed),
and Redis memory per queued prompt against the prompt's raw size (batches are stored compressed), with
where it goes: the batches, the run's ids (with the fingerprints of explicit ids), the queue's messages.

    .venv/bin/python benchmarks/bench_enqueue.py [--rows 1000000] [--long-prompts] [--from s3-parquet]
        [--processes 1,default]

`--from s3-parquet` writes the same rows as Parquet shards of SHARD_ROWS each into an S3 endpoint
(moto's server, over HTTP) and enqueues the prefix `s3://bench/prompts/` instead of a local JSONL file.

The default prompts are short (15-45 words of a 13-word vocabulary, ~150 bytes), which shows the
per-prompt overhead. `--long-prompts` draws 100-600 words from 5,000 made-up words (~2.4 KB, about as
compressible as prose), the size of a reasoning dataset's problem statements: Redis then holds mostly
the compressed text.

Last lines, one per --processes value: processes=<value> enqueue_1m_s=<seconds for the full count, scaled
to 1M rows if --rows differs> rerun_1m_s=<the same for the re-run>.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devstack.local_stack import PROJECT_ROOT, free_port, start_redis
from devstack.runs import memory_by_prefix
from producer.settings import REDIS_URL_ENV
from workers.state.keys import RunKeys
from workers.state.queues import GENERATE_QUEUE

ONE_MILLION = 1_000_000
TEN_MILLION = 10 * ONE_MILLION
REDIS_MEMORY_BYTES = 64 * 2**30
SMALL_ROWS = 100_000
WORDS = (
    "explain",
    "why",
    "the",
    "proof",
    "of",
    "a",
    "theorem",
    "holds",
    "in",
    "every",
    "case",
    "with",
    "code",
)
RSS_SAMPLE_S = 0.2
STAT_UTIME, STAT_STIME = 11, 12  # in /proc/<pid>/stat after the name
HEAD_NODE_CORES = 8
KIB_PER_MIB = 1024
SOURCES = ("jsonl", "s3-parquet")
BUCKET = "bench"
PREFIX = "prompts/"
SMALL_PREFIX = "small/"
SHARD_ROWS = 1_000_000
ROW_GROUP_ROWS = 64 * 1024
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
ERROR_TAIL_CHARS = 3000
DEFAULT_PROCESSES = "default"  # no --processes: what users run (one process per core above 20,000 rows)
SHORT_PROMPT_WORDS = (15, 45)
LONG_PROMPT_WORDS = (100, 600)
LONG_VOCABULARY_WORDS = 5000
LONG_WORD_LETTERS = (2, 9)
LETTERS = "etaoinshrdlucmfwypvbgkjqxz"  # English letter frequency order, weighted below


def long_vocabulary(rng: random.Random) -> tuple[str, ...]:
    weights = [len(LETTERS) - rank for rank in range(len(LETTERS))]
    return tuple(
        "".join(rng.choices(LETTERS, weights=weights, k=rng.randint(*LONG_WORD_LETTERS)))
        for _ in range(LONG_VOCABULARY_WORDS)
    )


def prompt_texts(rows: int, long_prompts: bool) -> Iterator[str]:
    """The benchmark's prompts, the same for every source."""
    rng = random.Random(0)
    vocabulary = long_vocabulary(rng) if long_prompts else WORDS
    words = LONG_PROMPT_WORDS if long_prompts else SHORT_PROMPT_WORDS
    for _ in range(rows):
        yield " ".join(rng.choices(vocabulary, k=rng.randint(*words)))


def write_dataset(path: Path, rows: int, long_prompts: bool) -> int:
    """A JSONL of varied prompts; returns the raw bytes of all prompt texts."""
    raw = 0
    with path.open("w") as handle:
        for i, text in enumerate(prompt_texts(rows, long_prompts)):
            raw += len(text.encode())
            handle.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": text}]}) + "\n")
    return raw


def write_parquet_shards(s3: Any, prefix: str, rows: int, long_prompts: bool) -> int:
    """The same prompts as Parquet shards (columns id, prompt) under s3://BUCKET/prefix; returns the raw
    bytes of all prompt texts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = 0
    texts = prompt_texts(rows, long_prompts)
    for shard, first in enumerate(range(0, rows, SHARD_ROWS)):
        count = min(SHARD_ROWS, rows - first)
        prompts = list(islice(texts, count))
        raw += sum(len(text.encode()) for text in prompts)
        table = pa.table({"id": [f"p{i}" for i in range(first, first + count)], "prompt": prompts})
        body = io.BytesIO()
        pq.write_table(table, body, row_group_size=ROW_GROUP_ROWS)
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}part-{shard:05d}.parquet", Body=body.getvalue())
    return raw


def enqueue(
    data: str,
    redis_url: str,
    run: str,
    output: Path,
    env: dict[str, str] | None = None,
    processes: str = DEFAULT_PROCESSES,
) -> Enqueued:
    """How `python -m producer enqueue` went, with `--processes` unless the default is asked for."""
    command = [
        sys.executable,
        "-m",
        "producer",
        "enqueue",
        data,
        "--run",
        run,
        "--output",
        str(output / run),  # an output belongs to one run
    ]
    if processes != DEFAULT_PROCESSES:
        command += ["--processes", processes]
    redis_cpu_before = redis_cpu_s(redis_url)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**(env or os.environ), REDIS_URL_ENV: redis_url},  # a password never goes on a command line
    )
    peak = PeakMemory(process.pid)
    peak.start()
    _, stderr = process.communicate()
    elapsed = time.monotonic() - started
    peak.stop()
    if process.returncode != 0:
        raise SystemExit(f"enqueue of {data} exited {process.returncode}:\n{stderr[-ERROR_TAIL_CHARS:]}")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    all_cpu_s = (children.ru_utime - children_before.ru_utime) + (
        children.ru_stime - children_before.ru_stime
    )
    return Enqueued(
        wall_s=elapsed,
        largest_kib=peak.largest_kib,
        all_kib=peak.all_kib,
        reader_cpu_s=peak.root_cpu_s,
        all_cpu_s=all_cpu_s,
        redis_cpu_s=redis_cpu_s(redis_url) - redis_cpu_before,
    )


def redis_cpu_s(redis_url: str) -> float:
    """The CPU seconds redis-server has used (user and system)."""
    cpu = redis.Redis.from_url(redis_url).info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def cpu_s(pid: int) -> float:
    """The CPU seconds a process has used (its own, not its children's)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[STAT_UTIME]) + int(fields[STAT_STIME])) / os.sysconf("SC_CLK_TCK")
    return 0.0


@dataclass(frozen=True)
class Enqueued:
    """One enqueue's wall time, and its peak resident memory (of its largest process, of all together)."""

    wall_s: float
    largest_kib: int
    all_kib: int
    reader_cpu_s: float  # the process that reads and deals the rows (all the work, in one process)
    all_cpu_s: float  # it and its parts
    redis_cpu_s: float

    def cpu(self) -> str:
        parts = self.all_cpu_s - self.reader_cpu_s
        reading = f"reading process {self.reader_cpu_s:.1f} s"
        return f"CPU: {reading}, parts {parts:.1f} s, Redis {self.redis_cpu_s:.1f} s"

    def floor_s(self, cores: int) -> float:
        """The wall time these CPU seconds need at least on `cores` cores: the reading process and Redis
        each use one, the parts share the rest."""
        everything = self.all_cpu_s + self.redis_cpu_s
        return max(self.reader_cpu_s, self.redis_cpu_s, everything / cores)

    def memory(self) -> str:
        return (
            f"peak RSS {self.largest_kib / KIB_PER_MIB:.0f} MiB, "
            f"{self.all_kib / KIB_PER_MIB:.0f} MiB all processes"
        )


class PeakMemory:
    """The peak resident memory of a process and its children, sampled every RSS_SAMPLE_S: of the
    largest process, and of all together."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.largest_kib = 0
        self.all_kib = 0
        self.root_cpu_s = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stopped.wait(RSS_SAMPLE_S):
            self.root_cpu_s = cpu_s(self._pid) or self.root_cpu_s  # its last reading before it exits
            sizes = [rss_kib(pid) for pid in process_tree(self._pid)]
            self.largest_kib = max(self.largest_kib, *sizes, 0)
            self.all_kib = max(self.all_kib, sum(sizes))


def process_tree(root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    tree, index = [root], 0
    while index < len(tree):
        tree += children.get(tree[index], [])
        index += 1
    return tree


def rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@contextlib.contextmanager
def s3_endpoint() -> Iterator[tuple[dict[str, str], Any]]:
    """moto's S3 server over HTTP with the benchmark's bucket: the environment a child process reaches it
    with, and a client."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {**os.environ, **FAKE_AWS_ENV, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        s3 = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=FAKE_AWS_ENV["AWS_DEFAULT_REGION"],
        )
        s3.create_bucket(Bucket=BUCKET)
        yield env, s3
    finally:
        server.stop()


def memory_by_kind(client: redis.Redis, run: str) -> dict[str, int]:
    """Where a queued run's Redis bytes are, by what the keys hold."""
    keys = RunKeys(run)
    return memory_by_prefix(
        client,
        {
            keys.batches_prefix: "batches (compressed prompts)",
            keys.ids_prefix: "the run's ids, with their fingerprints",
            GENERATE_QUEUE: "messages in the queue",
        },
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=ONE_MILLION)
    parser.add_argument("--long-prompts", action="store_true", help="~2.4 KB prompts instead of ~150 B")
    parser.add_argument("--from", dest="source", choices=SOURCES, default=SOURCES[0])
    parser.add_argument(
        "--processes",
        default=f"1,{DEFAULT_PROCESSES}",
        help="enqueue processes to compare, side by side in one run: numbers, or 'default' for none given "
        "(default: 1,default)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        root = Path(scratch)
        small_rows = min(SMALL_ROWS, args.rows)
        env = None
        if args.source == SOURCES[0]:
            small, full = str(root / "small.jsonl"), str(root / "full.jsonl")
            write_dataset(Path(small), small_rows, args.long_prompts)
            raw_bytes = write_dataset(Path(full), args.rows, args.long_prompts)
        else:
            env, s3 = stack.enter_context(s3_endpoint())
            small, full = f"s3://{BUCKET}/{SMALL_PREFIX}", f"s3://{BUCKET}/{PREFIX}"
            write_parquet_shards(s3, SMALL_PREFIX, small_rows, args.long_prompts)
            raw_bytes = write_parquet_shards(s3, PREFIX, args.rows, args.long_prompts)
        process = start_redis(free_port(), root / "redis", root)
        stack.callback(process.stop)
        redis_url = process.url
        client = redis.Redis.from_url(redis_url)
        small_run = enqueue(small, redis_url, "small", root / "out", env)
        compared: list[tuple[str, Enqueued, Enqueued]] = []
        for processes in args.processes.split(","):  # side by side, each into an empty Redis
            client.flushall()
            output = root / f"out-{len(compared)}"
            before = int(client.info("memory")["used_memory"])
            first = enqueue(full, redis_url, "full", output, env, processes)
            after = int(client.info("memory")["used_memory"])
            by_kind = memory_by_kind(client, "full")
            compared.append((processes, first, enqueue(full, redis_url, "full", output, env, processes)))
    shards = f" ({-(-args.rows // SHARD_ROWS)} Parquet shards, S3 over HTTP)" if env else ""
    print(f"source                   {full}{shards}")
    per_prompt = (after - before) / args.rows
    raw_per_prompt = raw_bytes / args.rows
    print(f"rows                     {args.rows:,} (~{raw_per_prompt:.0f} bytes of prompt text each)")
    for processes, first, again in compared:
        print(f"--processes {processes}:")
        print(
            f"  enqueue wall time      {first.wall_s:.1f} s  ({args.rows / first.wall_s:,.0f} prompts/s; "
            f"{first.memory()})"
        )
        print(
            f"  re-run, all there      {again.wall_s:.1f} s  ({args.rows / again.wall_s:,.0f} rows/s, "
            f"{first.wall_s / again.wall_s:.2f} x the first run's speed; {again.memory()})"
        )
        print(f"  first enqueue's {first.cpu()}; the re-run's {again.cpu()}")
        print(
            f"  on {HEAD_NODE_CORES} cores, these CPU seconds need at least: first enqueue "
            f"{first.floor_s(HEAD_NODE_CORES):.1f} s, re-run {again.floor_s(HEAD_NODE_CORES):.1f} s"
        )
    if len(compared) > 1:
        (one, one_first, one_again), (other, other_first, other_again) = compared[0], compared[-1]
        print(
            f"--processes {other} against {one}: first enqueue {one_first.wall_s / other_first.wall_s:.2f} x "
            f"as fast, re-run {one_again.wall_s / other_again.wall_s:.2f} x"
        )
    print(
        f"at {min(SMALL_ROWS, args.rows):,} rows        {small_run.memory()}  "
        f"(took {small_run.wall_s:.1f} s; flat when it matches the full run's)"
    )
    print(
        f"Redis memory per prompt  {per_prompt:.0f} bytes ({per_prompt / raw_per_prompt:.2f} x its raw text, "
        "ids and queue included)"
    )
    for kind, used in sorted(by_kind.items(), key=lambda item: -item[1]):
        print(f"  {kind:<34} {used / args.rows:.0f} bytes a prompt")
    ten_million_gib = per_prompt * TEN_MILLION / 2**30
    print(
        f"10M prompts queued       {ten_million_gib:.1f} GiB of Redis (a 64 GB Redis queues "
        f"{REDIS_MEMORY_BYTES / per_prompt / ONE_MILLION:,.0f}M at once)"
    )
    print(f"redis_bytes_per_prompt={per_prompt:.0f} queued_10m_gib={ten_million_gib:.1f}")
    scale = ONE_MILLION / args.rows
    for processes, first, again in compared:
        print(
            f"processes={processes} enqueue_1m_s={first.wall_s * scale:.1f} "
            f"rerun_1m_s={again.wall_s * scale:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
