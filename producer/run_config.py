"""A run's generation settings from three layers: what is pinned (or the defaults), a TOML file, options.

An existing run's pinned settings are the base, so re-running `enqueue` without options changes
nothing; only what the user states explicitly can differ, and a difference is refused.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from inference.records import SamplingSettings
from producer.errors import SettingsError
from workers.runs import DEFAULT_BATCH_SIZE, QualityGate, RunSettings
from workers.storage import UnsupportedStoreUrl, normalise_output_url

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


def resolve_run_settings(
    run: str,
    *,
    pinned: RunSettings | None,
    file_values: Mapping[str, Any],
    option_values: Mapping[str, Any],
    default_output: str = DEFAULT_OUTPUT,
) -> RunSettings:
    """Layer options over the file over the pinned settings (or the defaults)."""
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
    for layer in (file_values, option_values):
        for key, value in layer.items():
            if value is None:
                continue
            if key in SAMPLING_FIELDS:
                base["sampling"][key] = value
            elif key in GATE_FIELDS:
                base.setdefault("gate", msgspec.to_builtins(QualityGate()))[GATE_FIELDS[key]] = value
            else:
                base[key] = value
    try:
        base["output_url"] = normalise_output_url(str(base["output_url"]))
        settings = msgspec.convert(base, type=RunSettings)
    except (msgspec.ValidationError, UnsupportedStoreUrl) as error:
        raise SettingsError(f"invalid run settings: {error}") from error
    if settings.batch_size < 1:
        raise SettingsError(f"batch_size must be at least 1, got {settings.batch_size}")
    if settings.sampling.max_tokens < 1:
        raise SettingsError(f"max_tokens must be at least 1, got {settings.sampling.max_tokens}")
    return settings
