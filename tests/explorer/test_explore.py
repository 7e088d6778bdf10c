"""Explore the protocol's schedules instead of listing them: hundreds of seeded interleavings of an
enqueue, two generate workers, their tails, renewals and reconcile passes, and the uploader, with
processes killed between any two Redis calls, messages duplicated and lost, and Redis rolled back.

`scripts/test --explore N` runs N schedules from a fresh random seed; a failure prints its seed, and
`DRAFTGEN_EXPLORE_SEED=<seed> scripts/test --explore 1` replays it, call for call.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
import redis

from producer import enqueue
from tests.explorer.explorer import explore
from tests.explorer.fleet import InlineExecutor, NoRenewer
from workers.recovery import seat

pytestmark = pytest.mark.integration

# ~2.5 minutes on two idle cores (each schedule: ~800 actions, 5 checks after each; 1.3 s a schedule since
# enqueues run in parts and the input repeats every prompt)
SCHEDULES_IN_CI = 120
# Room for a machine six times slower than idle: a busy CI runner, or `--explore N` under load.
TIMEOUT_PER_SCHEDULE_S = 15
CI_FIRST_SEED = 0  # CI replays the same schedules every time; `--explore` picks new ones
FRESH_SEEDS = 2**31


def first_seed(environ: Mapping[str, str]) -> int:
    """A replay's seed; else a fresh one when schedules were asked for by number; else CI's."""
    if environ.get("DRAFTGEN_EXPLORE_SEED"):
        return int(environ["DRAFTGEN_EXPLORE_SEED"])
    if "DRAFTGEN_EXPLORE_SCHEDULES" in environ:
        return random.SystemRandom().randrange(FRESH_SEEDS)
    return CI_FIRST_SEED


SCHEDULES = int(os.environ.get("DRAFTGEN_EXPLORE_SCHEDULES", SCHEDULES_IN_CI))


@pytest.mark.timeout(SCHEDULES * TIMEOUT_PER_SCHEDULE_S)
def test_no_explored_schedule_loses_duplicates_or_strands_a_prompt(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(enqueue, "ThreadPoolExecutor", InlineExecutor)
    monkeypatch.setattr(enqueue, "PeriodicThread", NoRenewer)
    monkeypatch.setattr(seat, "PeriodicThread", NoRenewer)  # a seat's keeper turns when the schedule says
    monkeypatch.setattr(seat, "RECONNECT_BACKOFF_CAP_S", 0.0)  # its reconnects wait on no real clock
    schedules = SCHEDULES
    first = first_seed(os.environ)
    print(f"exploring {schedules} schedules from seed {first}")
    admin = redis.Redis.from_url(redis_url)
    faults: Counter[str] = Counter()
    actions = checks = in_parts = 0
    for seed in range(first, first + schedules):
        admin.flushall()
        result, trace = explore(seed, redis_url, tmp_path / f"out-{seed}")
        faults += result.faults
        actions += result.actions
        checks += result.checks
        in_parts += result.enqueues_in_parts
        assert not result.violations, (
            result.describe(trace) + f"\nreplay: DRAFTGEN_EXPLORE_SEED={seed} scripts/test --explore 1"
        )
    print(
        f"explored {schedules} schedules from seed {first}: {actions} actions, {checks} invariant checks, "
        f"{in_parts} enqueues in parts, faults {dict(faults)} "
        f"({sum(faults.values()) / schedules:.1f} a schedule)"
    )
