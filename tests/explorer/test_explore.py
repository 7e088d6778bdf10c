"""Explore the protocol's schedules instead of listing them: hundreds of seeded interleavings of an
enqueue, two generate workers, their tails, renewals and reconcile passes, and the uploader, with
processes killed between any two Redis calls, messages duplicated and lost, and Redis rolled back.

`scripts/test --explore N` runs N schedules from a fresh random seed; a failure prints its seed, and
`DRAFTGEN_EXPLORE_SEED=<seed> scripts/test --explore 1` replays it, call for call. CI runs SCHEDULES_IN_CI
fixed schedules and COMMIT_SCHEDULES_IN_CI more from a seed the commit's hash gives, so each commit
explores new schedules, and any of them replays from the seed printed. The schedules go SCHEDULES_A_TEST
to a test, so that `scripts/test`'s pytest processes share them.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
import redis

from producer.enqueue import enqueuer as enqueue
from tests.explorer.explorer import explore
from tests.explorer.fleet import InlineExecutor, NoRenewer
from workers.record import uploader
from workers.recovery import seat

pytestmark = pytest.mark.integration

# ~3 s a schedule on an idle core (~1,000 actions in the faults, 8 checks after each, then the calm phase
# to the run's end: a few thousand more where poison is tried alone; up to 20 s). CI's set is sized by
# time: ~170 s of a core, an eighth of the suite's (docs/development.md, "Where the time goes").
# The same every time: a net under what was found. Each fix the explorer re-finds, reverted alone, fails
# within seeds 0-47 (docs/exactly-once.md lists them: the last to be caught first at 46).
SCHEDULES_IN_CI = 48
COMMIT_SCHEDULES_IN_CI = 12  # new ones with each commit, from a seed its hash gives: replayable
# Schedules a commit's seeds found a hole with, run every time: reverting the hole's fix fails here.
# 243126475: an enqueue re-run batched again a prompt whose finished batch the uploader re-opened meanwhile.
# 51943811 (the model's hole): a seat check parked across time passing stamped after pass_time's, stale.
FOUND_SEEDS = (243126475, 51943811)
# Room for a machine six times slower than idle: a busy CI runner, or `--explore N` under load.
TIMEOUT_PER_SCHEDULE_S = 30
SCHEDULES_A_TEST = 12
CI_FIRST_SEED = 0
FRESH_SEEDS = 2**31
COMMIT_SEED_HEX_DIGITS = 7
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def commit_seed() -> int | None:
    """The seed the checked-out commit gives (its hash's first hex digits), or None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return int(head[:COMMIT_SEED_HEX_DIGITS], 16)


def seed_ranges(environ: Mapping[str, str], from_commit: int | None) -> list[range]:
    """A replay's schedules; else fresh ones when schedules were asked for by number; else CI's: the fixed
    ones, those that found a hole, and the commit's."""
    if environ.get("DRAFTGEN_EXPLORE_SEED"):
        first = int(environ["DRAFTGEN_EXPLORE_SEED"])
        return [range(first, first + int(environ.get("DRAFTGEN_EXPLORE_SCHEDULES", "1")))]
    if "DRAFTGEN_EXPLORE_SCHEDULES" in environ:
        first = random.SystemRandom().randrange(FRESH_SEEDS)
        return [range(first, first + int(environ["DRAFTGEN_EXPLORE_SCHEDULES"]))]
    fixed = [range(CI_FIRST_SEED, CI_FIRST_SEED + SCHEDULES_IN_CI), *(range(s, s + 1) for s in FOUND_SEEDS)]
    if from_commit is None:
        return fixed
    return [*fixed, range(from_commit, from_commit + COMMIT_SCHEDULES_IN_CI)]


RANGES = seed_ranges(os.environ, commit_seed())


def chunks(ranges: list[range], size: int) -> list[list[int]]:
    """The seeds, `size` to a test: the chunks of one run may go to several pytest processes at once."""
    seeds = [seed for seeds in ranges for seed in seeds]
    return [seeds[i : i + size] for i in range(0, len(seeds), size)]


CHUNKS = chunks(RANGES, SCHEDULES_A_TEST)


@pytest.mark.timeout(SCHEDULES_A_TEST * TIMEOUT_PER_SCHEDULE_S)
@pytest.mark.parametrize("seeds", CHUNKS, ids=[f"seed{chunk[0]}+{len(chunk)}" for chunk in CHUNKS])
def test_no_explored_schedule_loses_duplicates_strands_a_prompt_or_holds_a_run_open(
    seeds: list[int], redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(enqueue, "ThreadPoolExecutor", InlineExecutor)
    monkeypatch.setattr(enqueue, "PeriodicThread", NoRenewer)
    monkeypatch.setattr(seat, "PeriodicThread", NoRenewer)  # a seat's keeper turns when the schedule says
    monkeypatch.setattr(uploader, "PeriodicThread", NoRenewer)  # a flush's lock runs out as time passes
    monkeypatch.setattr(seat, "RECONNECT_BACKOFF_CAP_S", 0.0)  # its reconnects wait on no real clock
    admin = redis.Redis.from_url(redis_url)
    faults: Counter[str] = Counter()
    actions = checks = in_parts = 0
    for seed in seeds:
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
        f"explored {len(seeds)} schedules from seed {seeds[0]}: {actions} actions, "
        f"{checks} invariant checks, {in_parts} enqueues in parts, faults {dict(faults)} "
        f"({sum(faults.values()) / len(seeds):.1f} a schedule)"
    )
