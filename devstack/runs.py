"""A run enqueued in-process, as `python -m producer enqueue` does it: for the benchmarks, which time
the pipeline rather than the command line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import redis

from core.records import Prompt
from core.run_settings.model import RunSettings
from producer.enqueue.enqueuer import Enqueuer, pin_settings
from producer.enqueue.publisher import BatchPublisher
from workers.broker.broker import sending_app
from workers.record.output_pin import write_run_json
from workers.record.storage import open_store
from workers.settings import WorkerSettings

BENCH_SOURCE = "bench"
SCAN_COUNT = 1000  # keys per SCAN round trip
OTHER_KEYS = "everything else"


def memory_by_prefix(client: redis.Redis, kinds: Mapping[str, str]) -> dict[str, int]:
    """Redis bytes (MEMORY USAGE) of every key, summed by the kind its prefix names; the rest under
    "everything else"."""
    found: dict[str, int] = {}
    for raw in client.scan_iter(count=SCAN_COUNT):
        key = raw.decode()
        kind = next((name for prefix, name in kinds.items() if key.startswith(prefix)), OTHER_KEYS)
        found[kind] = found.get(kind, 0) + int(client.memory_usage(key, samples=0) or 0)
    return found


def enqueue_run(
    client: redis.Redis, redis_url: str, settings: RunSettings, prompts: Iterable[Prompt]
) -> RunSettings:
    """Pin the settings, write the output's run.json (the uploader checks it before writing) and enqueue,
    publishing to the Redis at `redis_url` (the client's)."""
    pinned = pin_settings(client, settings)
    write_run_json(open_store(pinned.output), pinned)
    publisher = BatchPublisher(sending_app(WorkerSettings(redis_url=redis_url).broker))
    try:
        Enqueuer(client, pinned, publisher, source=BENCH_SOURCE).enqueue(prompts)
    finally:
        publisher.close()
    return pinned
