"""Every setting of a run by the name the user states it with (an option's dest, a TOML key): where it sits
in `RunSettings`, the option that sets it, its type, and why a value of it cannot be used. Each is written
here once; reading a file, checking a value, naming its option and placing it in the struct all go by it.

The sampling limits are what SGLang 0.5.23 accepts (sampling/sampling_params.py:252-293, see
shared/reference/sglang-api.md §1): outside them it answers 400 to every request, so a run would
dead-letter every prompt; such a value is refused where it is stated, before anything is pinned.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from core.kept_columns import COLUMN_KINDS
from core.run_settings.model import KEEP_ALL_COLUMNS, RunSettings

TOP_K_OFF = -1  # SGLang's "no top-k" (the OpenAI default); 0 and anything below -1 are refused
MAX_TOKENS_LIMIT = 1 << 20  # tokens: above the context window of any model served today
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # SGLang's sampling_seed is an int64
# A batch is one message and one lease: it must finish far within the visibility timeout (2 h), and
# its compressed blob stays small in Redis. 4,096 prompts of 32k tokens is already days of one GPU.
MAX_BATCH_SIZE = 4096
MAX_GATE_MIN_COMPLETIONS = 1_000_000  # completions: a gate that waits longer never judges a run
MAX_FIELD_NAME_CHARS = 256

Problem = Callable[[Any], str | None]  # why a value of the declared type cannot be used, or None


@dataclass(frozen=True)
class SettingKey:
    name: str  # as stated: `top_p`, `gate_max_empty_answer_rate`, `output`
    path: tuple[str, ...]  # where it sits in RunSettings: ("sampling", "top_p")
    flag: str  # the option that sets it: `--top-p`
    problem: Problem

    @property
    def value_type(self) -> Any:
        """The type the struct declares for it, which a stated value must convert to."""
        return _declared_type(self.path)


@functools.cache
def _declared_type(path: tuple[str, ...]) -> Any:
    declared: Any = RunSettings
    for part in path:
        declared = typing.get_type_hints(declared)[part]
    return declared


def _any(_: Any) -> None:
    return None


def _within(allows: Callable[[float], bool], rule: str) -> Problem:
    return lambda value: None if allows(value) else rule


def _between(low: int, high: int, unit: str) -> Problem:
    return _within(lambda value: low <= value <= high, f"must be between {low} and {high} {unit}")


def _served_model(value: str) -> str | None:
    return None if value.strip() else "must name the served model (default: 'default')"


def _column_name(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip():
        return "must be a column name"
    if len(value) > MAX_FIELD_NAME_CHARS or not value.isprintable():
        return f"must be a column name of at most {MAX_FIELD_NAME_CHARS} printable characters"
    return None


CHAT_ROLES = ("system", "user", "assistant")  # what a dataset's own role names may stand for


def _turn_keys(value: tuple[str, str] | None) -> str | None:
    if value is None:
        return None
    problems = [problem for key in value if (problem := _column_name(key)) is not None]
    if problems:
        return f"names the role's key and the text's key: each {problems[0].removeprefix('must be ')}"
    return "must name two different keys: the role's, then the text's" if value[0] == value[1] else None


def _role_names(value: dict[str, str] | None) -> str | None:
    if value is None:
        return None
    if not value:
        return "must map at least one role name (NAME=ROLE)"
    for name, role in value.items():
        if (problem := _column_name(name)) is not None:
            return f"role name {name!r}: {problem.replace('column name', 'role name')}"
        if role not in CHAT_ROLES:
            return f"{name}={role}: a role name stands for one of {', '.join(CHAT_ROLES)}"
    return None


# The keys an export's row holds of its own (producer/export/formats.py): a kept column, written beside
# them in every row, may not take one of these names.
EXPORT_ROW_KEYS = ("id", "conversations", "messages", "run", "part", "input_ids", "loss_mask", "metadata")
# SpecForge hands every column of a row but `conversations` and `id` to the chat template as a variable
# (producer/export/formats.py): a kept column of one of these names would change what the template renders.
CHAT_TEMPLATE_VARIABLES = (
    "tools",
    "documents",
    "enable_thinking",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "tokenize",
    "system_prompt",
    "date_string",
    "bos_token",
    "eos_token",
)


def _reserved_column_problem(name: str) -> str | None:
    if name in EXPORT_ROW_KEYS:
        return f"column {name!r} would clash with the {name!r} of every exported row: keep another"
    if name in CHAT_TEMPLATE_VARIABLES:
        return f"column {name!r} would reach SpecForge's chat template as its {name!r}: keep another"
    return None


def _kept_column_names(value: tuple[str, ...] | None) -> str | None:
    if value is None:
        return None
    if not value:
        return f"must name at least one column, or {KEEP_ALL_COLUMNS!r} for all"
    if KEEP_ALL_COLUMNS in value:
        return None if len(value) == 1 else f"{KEEP_ALL_COLUMNS!r} keeps every column: name it alone"
    for name in value:
        if (problem := _column_name(name)) is not None:
            return f"column {name!r}: {problem}"
        if (problem := _reserved_column_problem(name)) is not None:
            return problem
    return "names a column twice" if len(set(value)) < len(value) else None


def column_types_problem(types: dict[str, str] | None) -> str | None:
    """Why pinned column types cannot be a run's (they are never stated, only read back)."""
    for name, kind in (types or {}).items():
        if (problem := _column_name(name)) is not None:
            return f"column {name!r}: {problem}"
        if (problem := _reserved_column_problem(name)) is not None:
            return problem
        if kind not in COLUMN_KINDS:
            return f"column {name!r}: {kind!r} is not one of {', '.join(COLUMN_KINDS)}"
    return None


_SHARE = _within(lambda value: 0 <= value <= 1, "must be a share between 0 and 1 (0.2 is 20%)")

SAMPLING_KEYS: tuple[SettingKey, ...] = (
    SettingKey("model", ("sampling", "model"), "--model", _served_model),
    SettingKey(
        "temperature",
        ("sampling", "temperature"),
        "--temperature",
        _within(
            lambda value: value >= 0, "must be 0 or more (0 is greedy; SGLang refuses a negative temperature)"
        ),
    ),
    SettingKey(
        "top_p",
        ("sampling", "top_p"),
        "--top-p",
        _within(
            lambda value: 0 < value <= 1,
            "must be above 0 and at most 1 (SGLang refuses values outside (0, 1])",
        ),
    ),
    SettingKey(
        "top_k",
        ("sampling", "top_k"),
        "--top-k",
        _within(
            lambda value: value == TOP_K_OFF or value >= 1,
            f"must be {TOP_K_OFF} (off) or 1 or more (SGLang refuses 0 and values below {TOP_K_OFF})",
        ),
    ),
    SettingKey(
        "min_p",
        ("sampling", "min_p"),
        "--min-p",
        _within(
            lambda value: 0 <= value <= 1, "must be between 0 and 1 (SGLang refuses values outside [0, 1])"
        ),
    ),
    SettingKey(
        "max_tokens",
        ("sampling", "max_tokens"),
        "--max-tokens",
        _within(
            lambda value: 1 <= value <= MAX_TOKENS_LIMIT,
            f"must be between 1 and {MAX_TOKENS_LIMIT} tokens (thinking included)",
        ),
    ),
    SettingKey("enable_thinking", ("sampling", "enable_thinking"), "--thinking", _any),
    SettingKey(
        "seed",
        ("sampling", "seed"),
        "--seed",
        _within(
            lambda value: value is None or SEED_MIN <= value <= SEED_MAX,
            "must fit in 64 bits (SGLang's sampling_seed is an int64)",
        ),
    ),
)
RUN_KEYS: tuple[SettingKey, ...] = (
    SettingKey("output", ("output",), "--output", _any),  # checked by the store that will hold it
    SettingKey(
        "batch_size", ("batch_size",), "--batch-size", _between(1, MAX_BATCH_SIZE, "prompts per message")
    ),
    SettingKey("turns", ("turns",), "--turns", _any),
    SettingKey("truncated_thinking", ("truncated_thinking",), "--truncated-thinking", _any),
    SettingKey(
        "retry_max_tokens_cap",
        ("retry_max_tokens_cap",),
        "--retry-max-tokens-cap",
        _between(1, MAX_TOKENS_LIMIT, "tokens"),
    ),
    SettingKey(
        "gate_min_completions",
        ("gate", "min_completions"),
        "--gate-min-completions",
        _between(1, MAX_GATE_MIN_COMPLETIONS, "completions"),
    ),
    SettingKey(
        "gate_max_empty_answer_rate", ("gate", "max_empty_answer_rate"), "--gate-max-empty-rate", _SHARE
    ),
    SettingKey(
        "gate_max_truncated_rate", ("gate", "max_truncated_rate"), "--gate-max-truncated-rate", _SHARE
    ),
    SettingKey("prompt_field", ("prompt_field",), "--prompt-field", _column_name),
    SettingKey("messages_field", ("messages_field",), "--messages-field", _column_name),
    SettingKey("system_field", ("system_field",), "--system-field", _column_name),
    SettingKey("id_field", ("id_field",), "--id-field", _column_name),
    SettingKey("turn_keys", ("turn_keys",), "--turn-keys", _turn_keys),
    SettingKey("roles", ("roles",), "--roles", _role_names),
    SettingKey("keep_columns", ("keep_columns",), "--keep-columns", _kept_column_names),
)
KEYS: dict[str, SettingKey] = {key.name: key for key in (*SAMPLING_KEYS, *RUN_KEYS)}
SAMPLING_NAMES = tuple(key.name for key in SAMPLING_KEYS)
COLUMN_NAMES = (
    "prompt_field",
    "messages_field",
    "system_field",
    "id_field",
    "turn_keys",
    "roles",
    "keep_columns",
)


def value_problem(key: SettingKey, value: Any) -> str | None:
    """Why this value cannot be the setting's: not of its declared type, not finite, or outside its limits."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    try:
        converted = msgspec.convert(value, type=key.value_type)
    except msgspec.ValidationError as error:
        return f"invalid run settings: {error}"
    return key.problem(converted)


def settings_problems(settings: RunSettings) -> list[str]:
    """Each value of whole settings (a pinned copy read back) that the keys' limits refuse, with why."""
    fields = msgspec.to_builtins(settings)
    problems = []
    for key in KEYS.values():
        value: Any = fields
        for part in key.path:
            value = value.get(part) if isinstance(value, dict) else None
        if (problem := value_problem(key, value)) is not None:
            problems.append(f"{key.name} {value!r}: {problem}")
    if (problem := column_types_problem(settings.column_types)) is not None:
        problems.append(f"column_types: {problem}")
    return problems
