"""The gap between a conversation's turns, measured at the server: from one turn's last token (its
request finished) to the next turn's request arriving. Read from the simulator's request log.

A request id is `<run>:<prompt id>:<8 hex>`; a conversation's requests share run and prompt id, and
follow one another (each turn waits for the one before), so consecutive requests of one prompt are
consecutive turns (or a retry of the same turn, which counts the same: the slot was empty meanwhile).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from inference.simulator import RequestRecord

RID_PARTS = 3


def turn_gaps_s(records: Iterable[RequestRecord]) -> list[float]:
    """Each gap between two consecutive requests of one prompt: the later's arrival less the earlier's
    finish, in seconds. A request that never finished (dropped, hung) starts no gap."""
    by_prompt: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for record in records:
        parts = record.rid.split(":")
        if len(parts) == RID_PARTS:
            by_prompt[(parts[0], parts[1])].append(record)
    gaps: list[float] = []
    for requests in by_prompt.values():
        requests.sort(key=lambda r: r.received_at)
        for earlier, later in itertools.pairwise(requests):
            if earlier.finished_at is not None:
                gaps.append(later.received_at - earlier.finished_at)
    return gaps


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value at `fraction` (0..1) of the sorted values, nearest rank; NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def describe_gaps(gaps: Sequence[float]) -> str:
    """`n=…, p50=… ms, p99=… ms, max=… ms`."""
    return (
        f"n={len(gaps)} p50={percentile(gaps, 0.5) * 1000:.0f} ms p99={percentile(gaps, 0.99) * 1000:.0f} ms"
        f" max={max(gaps, default=math.nan) * 1000:.0f} ms"
    )
