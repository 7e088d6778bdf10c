"""Capped exponential backoff with full jitter, as a pure function."""

from __future__ import annotations

import random

DEFAULT_BACKOFF_BASE_S = 1.0
DEFAULT_BACKOFF_CAP_S = 60.0


def backoff_delay_s(
    attempt: int,
    *,
    base_s: float = DEFAULT_BACKOFF_BASE_S,
    cap_s: float = DEFAULT_BACKOFF_CAP_S,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait after failed attempt `attempt` (from 1): uniform in [0, min(cap, base * 2^(n-1))]."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    ceiling_s = min(cap_s, base_s * (2 ** (attempt - 1)))
    return (rng or random).uniform(0.0, ceiling_s)
