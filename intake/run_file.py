"""A run's settings file (`--config run.toml`) and the options stated over it, value by value.

    values = read_toml(Path("run.toml"))              # flat keys, as the options name them
    check_stated(values, options, file_label="run.toml")   # each stated value on its own
    sampling = stated_sampling(values, options)       # the defaults, then the file, then the options

What needs a run's pinned settings (layering over them, the output URL, the retry cap against the
budget) is the producer's (producer/run_config.py); this is what the file and the options say alone.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from core.records import SamplingSettings
from inference.sampling_options import MAX_TOKENS_LIMIT, sampling_flag, sampling_problem
from intake.errors import SettingsFileError

SAMPLING_FIELDS = frozenset(SamplingSettings.__struct_fields__)
GATE_FIELDS = {  # option or flat key -> field of the run's quality gate
    "gate_min_completions": "min_completions",
    "gate_max_empty_answer_rate": "max_empty_answer_rate",
    "gate_max_truncated_rate": "max_truncated_rate",
}
FIELD_MAPPINGS = ("prompt_field", "messages_field", "system_field", "id_field")  # a dataset's column names
RUN_FIELDS = frozenset(
    {
        "batch_size",
        "output_url",
        "truncated_thinking",
        "retry_max_tokens_cap",
        "turns",
        *GATE_FIELDS,
        *FIELD_MAPPINGS,
    }
)
MAX_FIELD_NAME_CHARS = 256
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
UNCHECKED_HERE = frozenset({"output_url"})  # a URL is checked by the store that will hold the output


def read_toml(path: Path) -> dict[str, Any]:
    """Flat keys, or sampling keys under `[sampling]` and gate keys under `[gate]` (without `gate_`)."""
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise SettingsFileError(f"cannot read settings file {path}: {error}") from error
    flat = {key: value for key, value in document.items() if key not in ("sampling", "gate")}
    flat.update(_section(document, "sampling", path))
    flat.update({f"gate_{key}": value for key, value in _section(document, "gate", path).items()})
    if "output" in flat:
        flat["output_url"] = flat.pop("output")
    unknown = set(flat) - SAMPLING_FIELDS - RUN_FIELDS
    if unknown:
        known = ", ".join(sorted(SAMPLING_FIELDS | RUN_FIELDS))
        raise SettingsFileError(f"{path}: unknown settings {', '.join(sorted(unknown))} (known: {known})")
    return flat


def _section(document: Mapping[str, Any], name: str, path: Path) -> Mapping[str, Any]:
    section = document.get(name, {})
    if not isinstance(section, Mapping):
        raise SettingsFileError(f"{path}: {name} must be a [{name}] table of settings")
    return section


def option_flag(key: str) -> str:
    """The `enqueue` option that sets a settings key: `top_p` -> `--top-p`."""
    return OPTION_FLAGS.get(key) or sampling_flag(key)


def stated_values(
    file_values: Mapping[str, Any], option_values: Mapping[str, Any], file_label: str = "the settings file"
) -> tuple[dict[str, Any], dict[str, str]]:
    """The values the user stated (options over the file), and where each came from, for messages."""
    stated: dict[str, Any] = {}
    origins: dict[str, str] = {}
    layers: tuple[tuple[Mapping[str, Any], Callable[[str], str]], ...] = (
        (file_values, lambda key: f"{file_label}: {key} ="),
        (option_values, option_flag),
    )
    for layer, label in layers:
        for key, value in layer.items():
            if value is not None:
                stated[key], origins[key] = value, label(key)
    return stated, origins


def check_values(values: Mapping[str, Any], where: Callable[[str], str]) -> None:
    """Refuse the first value SGLang would refuse or draftgen's limits exclude, saying where it came from."""
    for key, value in values.items():
        problem = sampling_problem(key, value) if key in SAMPLING_FIELDS else run_value_problem(key, value)
        if problem is not None:
            raise SettingsFileError(f"{where(key)} {value!r}: {problem}")


def check_stated(
    file_values: Mapping[str, Any], option_values: Mapping[str, Any], file_label: str = "the settings file"
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each value the user stated, on its own: what no pinned run can make right (a NaN, a rate above 1).
    Returns the stated values and where each came from (`stated_values`)."""
    stated, origins = stated_values(file_values, option_values, file_label)
    checked = {key: value for key, value in stated.items() if key not in UNCHECKED_HERE}
    check_values(checked, origins.__getitem__)
    return stated, origins


def stated_sampling(
    file_values: Mapping[str, Any], option_values: Mapping[str, Any], file_label: str = "the settings file"
) -> SamplingSettings:
    """The sampling a new run would pin: the defaults, then the file, then the options."""
    stated, _ = check_stated(file_values, option_values, file_label)
    sampling = {key: value for key, value in stated.items() if key in SAMPLING_FIELDS}
    try:
        return msgspec.convert({**msgspec.to_builtins(SamplingSettings()), **sampling}, type=SamplingSettings)
    except msgspec.ValidationError as error:
        raise SettingsFileError(f"invalid run settings: {error}") from error


def run_value_problem(key: str, value: object) -> str | None:
    """Why a run (not sampling) setting cannot be used, or None."""
    if key in FIELD_MAPPINGS:
        return _field_name_problem(value)
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


def _field_name_problem(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        return "must be a column name"
    if len(value) > MAX_FIELD_NAME_CHARS or not value.isprintable():
        return f"must be a column name of at most {MAX_FIELD_NAME_CHARS} printable characters"
    return None
