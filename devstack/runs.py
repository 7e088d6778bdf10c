"""A run enqueued in-process, as `python -m producer enqueue` does it: for the benchmarks, which time
the pipeline rather than the command line."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from inference.records import Prompt
from producer.enqueue import Enqueuer, pin_settings
from producer.publisher import BatchPublisher
from producer.recover import write_run_settings
from workers.runs import RunSettings
from workers.storage import open_store

BENCH_SOURCE = "bench"


def enqueue_run(
    client: redis.Redis, publisher: BatchPublisher, settings: RunSettings, prompts: Iterable[Prompt]
) -> RunSettings:
    """Pin the settings, write the output's run.json (the uploader checks it before writing) and enqueue."""
    pinned = pin_settings(client, settings)
    write_run_settings(open_store(pinned.output_url), pinned)
    Enqueuer(client, pinned, publisher, source=BENCH_SOURCE).enqueue(prompts)
    return pinned
