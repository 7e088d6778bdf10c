"""A run's generation settings from three layers: what is pinned (or the defaults), a TOML file, options.

An existing run's pinned settings are the base, so re-running `enqueue` without options changes
nothing; only what the user states explicitly can differ, and a difference is refused.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from inference.records import SamplingSettings
from inference.sampling_options import MAX_TOKENS_LIMIT, sampling_flag, sampling_problem
from producer.errors import OutputError, SettingsError
from workers.errors import UnsupportedStoreUrl
from workers.record.storage import normalise_output_url
from workers.state.runs import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_RETRY_MAX_TOKENS_CAP,
    QualityGate,
    RunSettings,
    TruncationPolicy,
)

DEFAULT_OUTPUT = "./output"
SAMPLING_FIELDS = frozenset(SamplingSettings.__struct_fields__)
GATE_FIELDS = {  # option or flat key -> field of the run's quality gate
    "gate_min_completions": "min_completions",
    "gate_max_empty_answer_rate": "max_empty_answer_rate",
    "gate_max_truncated_rate": "max_truncated_rate",
}
RUN_FIELDS = frozenset(
    {"batch_size", "output_url", "truncated_thinking", "retry_max_tokens_cap", *GATE_FIELDS}
)
OPTION_FLAGS = {  # settings keys whose `enqueue` option is not simply --key-with-dashes
    "output_url": "--output",
    "gate_max_empty_answer_rate": "--gate-max-empty-rate",
    "gate_max_truncated_rate": "--gate-max-truncated-rate",
}
# A batch is one message and one lease: it must finish far within the visibility timeout (2 h), and
# its compressed blob stays small in Redis. 4,096 prompts of 32k tokens is already days of one GPU.
MAX_BATCH_SIZE = 4096
MAX_GATE_MIN_COMPLETIONS = 1_000_000  # completions: a gate that waits longer never judges a run
RATE_FIELDS = frozenset({"gate_max_empty_answer_rate", "gate_max_truncated_rate"})
RUN_LIMITS: dict[str, tuple[int, int, str]] = {  # key -> (lowest, highest, unit)
    "batch_size": (1, MAX_BATCH_SIZE, "prompts per message"),
    "gate_min_completions": (1, MAX_GATE_MIN_COMPLETIONS, "completions"),
    "retry_max_tokens_cap": (1, MAX_TOKENS_LIMIT, "tokens"),
}


def read_toml(path: Path) -> dict[str, Any]:
    """Flat keys, or sampling keys under `[sampling]` and gate keys under `[gate]` (without `gate_`)."""
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise SettingsError(f"cannot read settings file {path}: {error}") from error
    flat = {key: value for key, value in document.items() if key not in ("sampling", "gate")}
    flat.update(document.get("sampling", {}))
    flat.update({f"gate_{key}": value for key, value in document.get("gate", {}).items()})
    if "output" in flat:
        flat["output_url"] = flat.pop("output")
    unknown = set(flat) - SAMPLING_FIELDS - RUN_FIELDS
    if unknown:
        known = ", ".join(sorted(SAMPLING_FIELDS | RUN_FIELDS))
        raise SettingsError(f"{path}: unknown settings {', '.join(sorted(unknown))} (known: {known})")
    return flat


def option_flag(key: str) -> str:
    """The `enqueue` option that sets a settings key: `top_p` -> `--top-p`."""
    return OPTION_FLAGS.get(key) or sampling_flag(key)


def check_stated_values(
    file_values: Mapping[str, Any], option_values: Mapping[str, Any], file_label: str = "the settings file"
) -> None:
    """Each value the user stated, on its own: what no pinned run can make right (a NaN, a rate above 1,
    an output URL of no kind), refused before Redis or the output is even asked."""
    stated, origins = _stated(file_values, option_values, file_label)
    _check_values({key: value for key, value in stated.items() if key != "output_url"}, origins, False)
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
        }
    )
    stated, origins = _stated(file_values, option_values, file_label)
    for key, value in stated.items():
        if key in SAMPLING_FIELDS:
            base["sampling"][key] = value
        elif key in GATE_FIELDS:
            base.setdefault("gate", msgspec.to_builtins(QualityGate()))[GATE_FIELDS[key]] = value
        else:
            base[key] = value
    _check_values(_flat_values(base), origins, pinned is not None)
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


def _stated(
    file_values: Mapping[str, Any], option_values: Mapping[str, Any], file_label: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The values the user stated (options over the file), and where each came from, for messages."""
    stated: dict[str, Any] = {}
    origins: dict[str, str] = {}
    layers = ((file_values, lambda key: f"{file_label}: {key} ="), (option_values, option_flag))
    for layer, label in layers:
        for key, value in layer.items():
            if value is not None:
                stated[key], origins[key] = value, label(key)
    return stated, origins


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


def _check_values(values: Mapping[str, Any], origins: Mapping[str, str], pinned: bool) -> None:
    for key, value in values.items():
        problem = sampling_problem(key, value) if key in SAMPLING_FIELDS else run_value_problem(key, value)
        if problem is not None:
            raise SettingsError(f"{_where(key, origins, pinned)} {value!r}: {problem}")


def run_value_problem(key: str, value: object) -> str | None:
    """Why a run (not sampling) setting cannot be used, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # a wrong type is msgspec's to name
    if key in RATE_FIELDS and not 0 <= value <= 1:
        return "must be a share between 0 and 1 (0.2 is 20%)"
    limits = RUN_LIMITS.get(key)
    if limits is not None and not limits[0] <= value <= limits[1]:
        return f"must be between {limits[0]} and {limits[1]} {limits[2]}"
    return None


def _check_retry_cap(settings: RunSettings, origins: Mapping[str, str]) -> None:
    """The retry policy doubles the budget up to the cap: a cap not above max_tokens never retries."""
    cap, budget = settings.retry_max_tokens_cap, settings.sampling.max_tokens
    if settings.truncated_thinking is TruncationPolicy.RETRY and cap <= budget:
        where = origins.get("retry_max_tokens_cap", f"the retry cap (default {DEFAULT_RETRY_MAX_TOKENS_CAP})")
        raise SettingsError(
            f"{where} {cap}: must be above max_tokens ({budget}) for --truncated-thinking retry, "
            "which doubles the budget up to the cap"
        )
