"""Long work prints a line every few seconds on stderr; work shorter than that prints nothing."""

from __future__ import annotations

import io
from collections.abc import Iterator

from producer.progress_lines import ProgressLines
from tests.support.clock import ManualClock

INTERVAL_S = 5.0


def test_work_that_ends_within_the_interval_prints_nothing() -> None:
    clock, out = ManualClock(0.0), io.StringIO()
    lines = ProgressLines("read rows", interval_s=INTERVAL_S, clock=clock, stream=out)
    for done in range(1, 1000):
        clock.now += 0.001
        lines.update(done)
    lines.finish(999)
    assert out.getvalue() == ""


def test_long_work_prints_one_line_per_interval_and_a_last_one_with_the_total() -> None:
    clock, out = ManualClock(0.0), io.StringIO()
    lines = ProgressLines("verified manifest entries", interval_s=INTERVAL_S, clock=clock, stream=out)
    for done in range(1, 13):
        clock.now += 1.0
        lines.update(done, 12)
    lines.finish(12, 12)
    assert out.getvalue().splitlines() == [
        "verified manifest entries: 5/12 (5 s)",
        "verified manifest entries: 10/12 (10 s)",
        "verified manifest entries: 12/12 (12 s)",
    ]


def test_counted_items_pass_through_unchanged_while_they_are_counted() -> None:
    clock, out = ManualClock(0.0), io.StringIO()
    lines = ProgressLines("read rows", interval_s=INTERVAL_S, clock=clock, stream=out)

    def slow_rows() -> Iterator[int]:
        for row in range(3):
            clock.now += 3.0
            yield row

    assert list(lines.counted(slow_rows())) == [0, 1, 2]
    assert out.getvalue().splitlines() == ["read rows: 2 (6 s)", "read rows: 3 (9 s)"]
