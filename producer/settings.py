"""The producer's own settings (where Redis is), read from the environment at the edge.

Building them refuses an unknown `DRAFTGEN_*` variable (workers.errors.InvalidSetting)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from core.run_settings.model import DEFAULT_OUTPUT_ROOT
from workers.settings import DEFAULT_REDIS_URL, ENV_PREFIX, check_environment

OUTPUT_ENV = ENV_PREFIX + "OUTPUT"
REDIS_URL_ENV = ENV_PREFIX + "REDIS_URL"
MAX_ENQUEUE_PROCESSES = 16  # each holds its own Redis and broker connections
PROCESSES_MIN_ROWS = 20_000  # a smaller input enqueues in one process sooner than processes start


def default_enqueue_processes() -> int:
    """One enqueue process per core this process may use, at most MAX_ENQUEUE_PROCESSES."""
    return min(len(os.sched_getaffinity(0)), MAX_ENQUEUE_PROCESSES)


@dataclass(frozen=True)
class ProducerSettings:
    redis_url: str = DEFAULT_REDIS_URL
    output_root: str = DEFAULT_OUTPUT_ROOT  # OUTPUT_ENV: a new run that states no output gets <root>/<run>

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProducerSettings:
        source = os.environ if env is None else env
        check_environment(source)  # a mistyped DRAFTGEN_* variable is refused, naming the nearest one
        return cls(
            redis_url=source.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL,
            output_root=source.get(OUTPUT_ENV) or cls.output_root,
        )
