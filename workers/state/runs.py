"""A run's pinned settings in Redis: written at its first enqueue, read by every worker and command.

The settings themselves, their defaults and limits are core's (core/run_settings/); a copy read back is
checked against those limits as it is decoded, like any byte read from Redis.
"""

from __future__ import annotations

from typing import Any

import msgspec
import redis

from core.run_settings.keys import settings_problems
from core.run_settings.model import RunSettings
from workers.errors import RecordUnreadable, RunBroken
from workers.state.codec import UNREADABLE, decode_json
from workers.state.keys import RunKeys
from workers.state.record_limits import SMALL_RECORD_LIMIT_BYTES

LEGACY_OUTPUT_FIELD = "output_url"  # the output's name in settings pinned before it had one name


def encode_run_settings(settings: RunSettings) -> bytes:
    return msgspec.json.encode(settings)


def decode_run_settings(raw: bytes) -> RunSettings:
    """A run's settings as Redis or the output's run.json holds them: RecordUnreadable for settings past
    their ceiling, that are not a run's settings, or that hold a value no run can be sent with."""
    fields = decode_json(raw, dict[str, Any], limit_bytes=SMALL_RECORD_LIMIT_BYTES)
    if LEGACY_OUTPUT_FIELD in fields and "output" not in fields:
        fields["output"] = fields.pop(LEGACY_OUTPUT_FIELD)
    try:
        settings = msgspec.convert(fields, type=RunSettings)
    except msgspec.ValidationError as error:
        raise RecordUnreadable(UNREADABLE, f"not a run's settings: {error}") from error
    problems = settings_problems(settings)
    if problems:
        raise RecordUnreadable(UNREADABLE, f"run settings hold values no run can use: {'; '.join(problems)}")
    return settings


def load_run_settings(client: redis.Redis, run: str) -> RunSettings:
    raw = client.get(RunKeys(run).settings)
    if raw is None:
        raise RunBroken(
            f"run {run!r} has no settings in Redis: was it enqueued with `python -m producer enqueue`?"
        )
    try:
        return decode_run_settings(raw)
    except RecordUnreadable as error:
        raise RunBroken(f"run {run!r}: its settings in Redis are unreadable: {error}") from error
