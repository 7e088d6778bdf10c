"""A run's generation settings from three layers: what is pinned (or the defaults), a TOML file, options.

An existing run's pinned settings are the base, so re-running `enqueue` without options changes
nothing; only what the user states explicitly can differ, and a difference is refused. The file and the
options are read, and each value checked on its own, in intake/run_file.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from core.records import SamplingSettings
from intake.errors import SettingsFileError
from intake.run_file import GATE_FIELDS, SAMPLING_FIELDS, check_stated, check_values, read_toml, stated_values
from producer.errors import OutputError, SettingsError
from workers.errors import UnsupportedStoreUrl
from workers.record.storage import normalise_output_url
from workers.state.runs import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_RETRY_MAX_TOKENS_CAP,
    NEW_RUN_TURNS,
    QualityGate,
    RunSettings,
    TruncationPolicy,
)

DEFAULT_OUTPUT = "./output"


@contextmanager
def _as_settings_error() -> Iterator[None]:
    try:
        yield
    except SettingsFileError as error:
        raise SettingsError(str(error)) from error


def read_settings_file(path: Path) -> dict[str, Any]:
    """`--config`'s flat keys (intake/run_file.py), refused as the producer's SettingsError."""
    with _as_settings_error():
        return read_toml(path)


def check_stated_values(
    file_values: Mapping[str, Any], option_values: Mapping[str, Any], file_label: str = "the settings file"
) -> None:
    """Each value the user stated, on its own: what no pinned run can make right (a NaN, a rate above 1,
    an output URL of no kind), refused before Redis or the output is even asked."""
    with _as_settings_error():
        stated, origins = check_stated(file_values, option_values, file_label)
    if "output_url" in stated:
        try:
            normalise_output_url(str(stated["output_url"]))
        except UnsupportedStoreUrl as error:
            raise OutputError(f"{origins['output_url']}: {error}") from error


def resolve_run_settings(
    run: str,
    *,
    pinned: RunSettings | None,
    file_values: Mapping[str, Any],
    option_values: Mapping[str, Any],
    default_output: str = DEFAULT_OUTPUT,
    file_label: str = "the settings file",
) -> RunSettings:
    """Layer options over the file over the pinned settings (or the defaults), then check every value.

    A value SGLang would refuse, or one outside draftgen's limits, raises SettingsError naming where it
    came from (`--top-p 2: ...`, `run.toml: temperature = nan: ...`, or the pinned value)."""
    base: dict[str, Any] = (
        msgspec.to_builtins(pinned)
        if pinned is not None
        else {
            "run": run,
            "sampling": msgspec.to_builtins(SamplingSettings()),
            "output_url": default_output,
            "batch_size": DEFAULT_BATCH_SIZE,
            "gate": msgspec.to_builtins(QualityGate()),
            "turns": NEW_RUN_TURNS.value,
        }
    )
    stated, origins = stated_values(file_values, option_values, file_label)
    for key, value in stated.items():
        if key in SAMPLING_FIELDS:
            base["sampling"][key] = value
        elif key in GATE_FIELDS:
            base.setdefault("gate", msgspec.to_builtins(QualityGate()))[GATE_FIELDS[key]] = value
        else:
            base[key] = value
    with _as_settings_error():
        check_values(_flat_values(base), lambda key: _where(key, origins, pinned is not None))
    try:
        base["output_url"] = normalise_output_url(str(base["output_url"]))
    except UnsupportedStoreUrl as error:
        raise OutputError(f"{_where('output_url', origins, pinned is not None)}: {error}") from error
    try:
        settings = msgspec.convert(base, type=RunSettings)
    except msgspec.ValidationError as error:
        raise SettingsError(f"invalid run settings: {error}") from error
    _check_retry_cap(settings, origins)
    return settings


def _flat_values(base: Mapping[str, Any]) -> dict[str, Any]:
    """Every settings value under its option key: sampling fields and gate fields lifted to the top."""
    values = {key: value for key, value in base.items() if key not in ("sampling", "gate")}
    values.update(base.get("sampling", {}))
    gate = base.get("gate", {})
    values.update({option: gate[field] for option, field in GATE_FIELDS.items() if field in gate})
    return values


def _where(key: str, origins: Mapping[str, str], pinned: bool) -> str:
    if key in origins:
        return origins[key]
    return f"the {'pinned' if pinned else 'default'} {key}"


def _check_retry_cap(settings: RunSettings, origins: Mapping[str, str]) -> None:
    """The retry policy doubles the budget up to the cap: a cap not above max_tokens never retries."""
    cap, budget = settings.retry_max_tokens_cap, settings.sampling.max_tokens
    if settings.truncated_thinking is TruncationPolicy.RETRY and cap <= budget:
        where = origins.get("retry_max_tokens_cap", f"the retry cap (default {DEFAULT_RETRY_MAX_TOKENS_CAP})")
        raise SettingsError(
            f"{where} {cap}: must be above max_tokens ({budget}) for --truncated-thinking retry, "
            "which doubles the budget up to the cap"
        )
