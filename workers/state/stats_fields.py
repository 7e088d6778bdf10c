"""The vocabulary of a run's `stats` hash: written by the ledger's scripts, read by the gate, status, metrics.

Counters over staged completions: `completions` (rows: a conversation is one), `turns` (generated
assistant turns: a conversation of 4 counts 4), the token totals (every turn's), and over their turns
`quality:<label>`, `finish:<reason>`;
over dead letters: `dead:<reason>`; `first_completion_at` (Redis clock, seconds); and
`token_ids_missing`, completions that came without their token ids (a server older than SGLang 0.5.23).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

COMPLETIONS = "completions"
TURNS = "turns"
COMPLETION_TOKENS = "completion_tokens"
REASONING_TOKENS = "reasoning_tokens"
PROMPT_TOKENS = "prompt_tokens"
FIRST_COMPLETION_AT = "first_completion_at"
TOKEN_IDS_MISSING = "token_ids_missing"  # completions whose server returned no token ids
QUALITY_PREFIX = "quality:"
FINISH_PREFIX = "finish:"
DEAD_PREFIX = "dead:"
# "Recent" rates, status's and a worker's own (Flower's worker page): completions of the last minute.
RATE_WINDOW_S = 60.0
# A counter is what HINCRBY writes: a signed 64-bit integer, at most 19 digits. Anything else is read as
# absent: "--5" or a huge number would make int() raise (it refuses past 4,300 digits).
COUNTER = re.compile(rb"-?[0-9]{1,19}")


def parse_counters(raw: Mapping[bytes, bytes]) -> dict[str, int]:
    """The integer fields of a stats hash (first_completion_at included); any other field is left out."""
    return {
        key.decode(errors="replace"): int(value) for key, value in raw.items() if COUNTER.fullmatch(value)
    }


def generated_turns(counters: Mapping[str, int]) -> int:
    """The assistant turns generated, which the quality and finish counters count. Counters kept before
    `turns` existed have their completions, one turn each."""
    return max(counters.get(TURNS, 0), counters.get(COMPLETIONS, 0))


def quality_field(label: str) -> str:
    return QUALITY_PREFIX + label


def finish_field(reason: str) -> str:
    return FINISH_PREFIX + reason


def dead_field(reason: str) -> str:
    return DEAD_PREFIX + reason
