"""The vocabulary of a run's `stats` hash: written by the ledger's scripts, read by the gate, status, metrics.

Counters over staged completions: `completions`, the token totals, `quality:<label>`, `finish:<reason>`;
over dead letters: `dead:<reason>`; and `first_completion_at` (Redis clock, seconds).
"""

from __future__ import annotations

COMPLETIONS = "completions"
COMPLETION_TOKENS = "completion_tokens"
REASONING_TOKENS = "reasoning_tokens"
PROMPT_TOKENS = "prompt_tokens"
FIRST_COMPLETION_AT = "first_completion_at"
QUALITY_PREFIX = "quality:"
FINISH_PREFIX = "finish:"
DEAD_PREFIX = "dead:"


def quality_field(label: str) -> str:
    return QUALITY_PREFIX + label


def finish_field(reason: str) -> str:
    return FINISH_PREFIX + reason


def dead_field(reason: str) -> str:
    return DEAD_PREFIX + reason
