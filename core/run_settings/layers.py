"""A run's settings from three layers: the pinned copy (or a new run's defaults), a TOML file, options.

    file = read_toml(Path("run.toml"))                          # flat keys, as the options name them
    stated = stated_settings(file, options, file_label="run.toml")  # each value checked, once, here
    settings = resolve(run, pinned=pinned, stated=stated, new_run_output=url)

An existing run's pinned settings are the base, so re-running `enqueue` without options changes nothing;
only what the user states can differ (the producer refuses a difference). A stated value is checked where
it is stated, naming where (`--top-p 2: ...`, `run.toml: temperature = nan: ...`); the pinned copy is
checked where it is read back (workers/state/runs.py), a new run's defaults are good by construction.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from core.bounded_files import read_bounded
from core.errors import SettingsRefused
from core.run_settings.keys import KEYS, value_problem
from core.run_settings.model import (
    DEFAULT_RETRY_MAX_TOKENS_CAP,
    RunSettings,
    TruncationPolicy,
    new_run_settings,
)

SECTIONS = {"sampling": "", "gate": "gate_"}  # a TOML table -> the prefix its keys take when flat
OUTPUT_KEY = "output"
SETTINGS_FILE_LIMIT_BYTES = 1 << 20  # a run's settings are a few hundred bytes


@dataclass(frozen=True)
class StatedSettings:
    """The values the user stated, options over the file, each checked; and where each came from."""

    values: Mapping[str, Any]
    origins: Mapping[str, str]  # `--top-p`, `run.toml: top_p =`

    def with_value(self, name: str, value: Any) -> StatedSettings:
        return StatedSettings({**self.values, name: value}, self.origins)


def read_toml(path: Path) -> dict[str, Any]:
    """Flat keys, or sampling keys under `[sampling]` and gate keys under `[gate]` (without `gate_`)."""
    data = read_bounded(path, limit_bytes=SETTINGS_FILE_LIMIT_BYTES, what="a settings file")
    try:
        document = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise SettingsRefused(f"cannot read settings file {path}: {error}") from error
    flat = {key: value for key, value in document.items() if key not in SECTIONS}
    for section, prefix in SECTIONS.items():
        flat.update({prefix + key: value for key, value in _section(document, section, path).items()})
    unknown = set(flat) - set(KEYS)
    if unknown:
        known = ", ".join(sorted(KEYS))
        raise SettingsRefused(f"{path}: unknown settings {', '.join(sorted(unknown))} (known: {known})")
    return flat


def _section(document: Mapping[str, Any], name: str, path: Path) -> Mapping[str, Any]:
    section = document.get(name, {})
    if not isinstance(section, Mapping):
        raise SettingsRefused(f"{path}: {name} must be a [{name}] table of settings")
    return section


def stated_settings(
    file_values: Mapping[str, Any], option_values: Mapping[str, Any], file_label: str = "the settings file"
) -> StatedSettings:
    """What the user stated (options over the file; None is unstated), each value checked on its own: one
    no run can use (a NaN, a rate above 1, text for a number) is refused naming where it came from."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for layer, label in ((file_values, f"{file_label}: {{}} ="), (option_values, None)):
        for name, value in layer.items():
            if value is None:
                continue
            key = KEYS.get(name)
            if key is None:
                raise SettingsRefused(f"{name}: not a run setting (known: {', '.join(sorted(KEYS))})")
            origin = key.flag if label is None else label.format(name)
            problem = value_problem(key, value)
            if problem is not None:
                raise SettingsRefused(f"{origin} {value!r}: {problem}")
            values[name], origins[name] = msgspec.convert(value, type=key.value_type), origin
    return StatedSettings(values, origins)


def resolve(
    run: str, *, pinned: RunSettings | None, stated: StatedSettings, new_run_output: str
) -> RunSettings:
    """The stated values over the pinned settings, or over a new run's defaults (its output
    `new_run_output`). Every value was checked where it came from; only their pairing is checked here."""
    base = msgspec.to_builtins(pinned if pinned is not None else new_run_settings(run, new_run_output))
    for name, value in msgspec.to_builtins(dict(stated.values)).items():
        *within, last = KEYS[name].path
        place = base
        for part in within:
            place = place[part]
        place[last] = value
    settings = msgspec.convert(base, type=RunSettings)
    _check_retry_cap(settings, stated.origins)
    return settings


def _check_retry_cap(settings: RunSettings, origins: Mapping[str, str]) -> None:
    """The retry policy doubles the budget up to the cap: a cap not above max_tokens never retries."""
    cap, budget = settings.retry_max_tokens_cap, settings.sampling.max_tokens
    if settings.truncated_thinking is TruncationPolicy.RETRY and cap <= budget:
        where = origins.get("retry_max_tokens_cap", f"the retry cap (default {DEFAULT_RETRY_MAX_TOKENS_CAP})")
        raise SettingsRefused(
            f"{where} {cap}: must be above max_tokens ({budget}) for --truncated-thinking retry, "
            "which doubles the budget up to the cap"
        )
