"""The producer's own settings (where Redis is), read from the environment at the edge."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from workers.settings import DEFAULT_REDIS_URL, ENV_PREFIX

DEFAULT_OUTPUT_ENV = ENV_PREFIX + "OUTPUT"


@dataclass(frozen=True)
class ProducerSettings:
    redis_url: str = DEFAULT_REDIS_URL
    default_output: str = "./output"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProducerSettings:
        source = os.environ if env is None else env
        return cls(
            redis_url=source.get(ENV_PREFIX + "REDIS_URL") or DEFAULT_REDIS_URL,
            default_output=source.get(DEFAULT_OUTPUT_ENV) or cls.default_output,
        )
