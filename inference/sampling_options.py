"""The command-line options of a run's sampling settings, shared by `producer enqueue` and `preflight`."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SAMPLING_OPTION_NAMES = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "enable_thinking",
    "seed",
)


def sampling_flag(name: str) -> str:
    """The option that sets a field: `top_p` -> `--top-p`, `enable_thinking` -> `--thinking`."""
    return "--thinking" if name == "enable_thinking" else "--" + name.replace("_", "-")


def add_sampling_options(
    parser: argparse.ArgumentParser, *, title: str, thinking_help: str, seed_help: str
) -> argparse._ArgumentGroup:
    """Add `--config` and one option per sampling field (all default to None: unset)."""
    group = parser.add_argument_group(title)
    group.add_argument("--config", type=Path, help="the run's TOML file (options override it)")
    group.add_argument("--model", help="model name sent in every request (the server's served name)")
    group.add_argument("--temperature", type=float)
    group.add_argument("--top-p", dest="top_p", type=float)
    group.add_argument("--top-k", dest="top_k", type=int)
    group.add_argument("--min-p", dest="min_p", type=float)
    group.add_argument("--max-tokens", dest="max_tokens", type=int, help="budget including thinking")
    group.add_argument(
        "--thinking",
        dest="enable_thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=thinking_help,
    )
    group.add_argument("--seed", type=int, help=seed_help)
    return group


# What SGLang 0.5.23 accepts (sampling/sampling_params.py:252-293, see shared/reference/sglang-api.md §1):
# outside these it answers 400 to every request, so a run would dead-letter every prompt. A run is
# refused such a value at enqueue, before anything of it is pinned.
TOP_K_OFF = -1  # SGLang's "no top-k" (the OpenAI default); 0 and anything below -1 are refused
MAX_TOKENS_LIMIT = 1 << 20  # tokens: above the context window of any model served today
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # SGLang's sampling_seed is an int64


@dataclass(frozen=True)
class SamplingLimit:
    allows: Callable[[float], bool]
    rule: str  # completes "--top-p 2: ..."


SAMPLING_LIMITS: dict[str, SamplingLimit] = {
    "temperature": SamplingLimit(
        lambda value: value >= 0, "must be 0 or more (0 is greedy; SGLang refuses a negative temperature)"
    ),
    "top_p": SamplingLimit(
        lambda value: 0 < value <= 1, "must be above 0 and at most 1 (SGLang refuses values outside (0, 1])"
    ),
    "top_k": SamplingLimit(
        lambda value: value == TOP_K_OFF or value >= 1,
        f"must be {TOP_K_OFF} (off) or 1 or more (SGLang refuses 0 and values below {TOP_K_OFF})",
    ),
    "min_p": SamplingLimit(
        lambda value: 0 <= value <= 1, "must be between 0 and 1 (SGLang refuses values outside [0, 1])"
    ),
    "max_tokens": SamplingLimit(
        lambda value: 1 <= value <= MAX_TOKENS_LIMIT,
        f"must be between 1 and {MAX_TOKENS_LIMIT} tokens (thinking included)",
    ),
    "seed": SamplingLimit(
        lambda value: SEED_MIN <= value <= SEED_MAX,
        "must fit in 64 bits (SGLang's sampling_seed is an int64)",
    ),
}


def sampling_problem(name: str, value: object) -> str | None:
    """Why SGLang would refuse this value of a sampling field, or None when it accepts it."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if name == "model" and isinstance(value, str) and not value.strip():
        return "must name the served model (default: 'default')"
    limit = SAMPLING_LIMITS.get(name)
    if limit is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if limit.allows(value) else limit.rule
