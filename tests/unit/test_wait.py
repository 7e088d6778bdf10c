"""`producer wait` ends when the run does and says how by its exit code; `producer runs` lines them up."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from core.exit_codes import (
    EXIT_FINISHED_WITH_DEAD_LETTERS,
    EXIT_OK,
    EXIT_PAUSED,
    EXIT_PAUSED_BY_GATE,
    EXIT_TIMED_OUT,
)
from producer.status.figures import (
    STATE_DRAINING,
    STATE_FINISHED,
    STATE_RUNNING,
    STATE_UPLOADING,
    make_progress,
    rates_over,
)
from producer.status.model import PauseFigures, RunStatus
from producer.status.runs import RunLine, render_runs
from producer.status.wait import REPORT_EVERY_S, Ending, WaitClock, ending_of, wait_for_run
from tests.support.status_samples import paused_young_status

PROMPTS = 1_000


def status_of(state: str, *, committed: int = 0, dead: int = 0, paused_by: str | None = None) -> RunStatus:
    base = paused_young_status(rates_over(3, 6_000, 4.0))
    paused = None
    if paused_by is not None:
        paused = PauseFigures(reason="empty answers", by=paused_by, at=base.now, for_s=0.0)
    progress = make_progress(enqueued=PROMPTS, committed=committed, staged=0, dead=dead, rejected=0)
    return msgspec.structs.replace(base, state=state, progress=progress, paused=paused)


class FakeClock:
    """Monotonic time that moves only when waiting sleeps."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds

    def clock(self) -> WaitClock:
        return WaitClock(now_s=lambda: self.now_s, sleep=self.sleep)


def wait_through(
    statuses: list[RunStatus], *, timeout_s: float | None = None, interval_s: float = 5.0
) -> tuple[Ending, list[str], FakeClock]:
    fake = FakeClock()
    snapshots: Iterator[RunStatus] = iter(statuses)
    last = statuses[-1]
    lines: list[str] = []
    ending = wait_for_run(
        lambda: next(snapshots, last),
        interval_s=interval_s,
        timeout_s=timeout_s,
        report=lines.append,
        clock=fake.clock(),
    )
    return ending, lines, fake


def test_a_run_that_finishes_with_every_prompt_committed_ends_the_wait_with_exit_0() -> None:
    ending, lines, fake = wait_through(
        [
            status_of(STATE_RUNNING, committed=100),
            status_of(STATE_RUNNING, committed=600),
            status_of(STATE_UPLOADING, committed=990),
            status_of(STATE_DRAINING, committed=PROMPTS),
            status_of(STATE_FINISHED, committed=PROMPTS),
        ]
    )
    assert ending.exit_code == EXIT_OK
    assert ending.verdict == "run demo finished: all 1,000 prompts committed"
    assert fake.slept == [5.0] * 4
    assert [line.split(" run demo ")[1].split(":")[0] for line in lines] == [
        STATE_RUNNING,
        STATE_UPLOADING,
        STATE_DRAINING,
        STATE_FINISHED,
    ]  # a line at each change of state, not at each look


def test_a_finished_run_with_dead_letters_exits_3_and_says_where_to_read_them() -> None:
    ending, _, _ = wait_through([status_of(STATE_FINISHED, committed=990, dead=10)])
    assert ending.exit_code == EXIT_FINISHED_WITH_DEAD_LETTERS
    assert "990 of 1,000 prompts committed, 10 dead-lettered" in ending.verdict
    assert "producer rejects --run demo --only dead" in ending.verdict


def test_a_run_the_quality_gate_paused_exits_4_and_one_paused_by_hand_5() -> None:
    by_gate, _, _ = wait_through([status_of(STATE_RUNNING), status_of("paused", paused_by="quality-gate")])
    by_hand, _, _ = wait_through([status_of("paused", paused_by="user")])
    assert by_gate.exit_code == EXIT_PAUSED_BY_GATE
    assert "paused by the quality gate: empty answers" in by_gate.verdict
    assert by_hand.exit_code == EXIT_PAUSED
    assert "paused by user" in by_hand.verdict and "producer resume --run demo" in by_hand.verdict


def test_the_timeout_gives_up_with_exit_124_while_the_run_goes_on() -> None:
    ending, _, fake = wait_through([status_of(STATE_RUNNING, committed=10)], timeout_s=12.0)
    assert ending.exit_code == EXIT_TIMED_OUT
    assert ending.verdict == "run demo is still running after 12 s: 10 of 1,000 prompts committed"
    assert fake.now_s == 15.0  # it looked at 0, 5, 10 and 15 s


def test_a_long_wait_in_one_state_still_reports_every_minute() -> None:
    looks = int(3 * REPORT_EVERY_S / 10.0)
    _, lines, _ = wait_through(
        [status_of(STATE_RUNNING)] * looks, timeout_s=3 * REPORT_EVERY_S, interval_s=10.0
    )
    assert len(lines) == 4  # at 0, 60, 120 and 180 s


def test_a_run_still_going_has_no_ending() -> None:
    assert ending_of(status_of(STATE_DRAINING, committed=PROMPTS)) is None


def test_the_runs_list_aligns_a_column_each_and_names_a_pause_and_an_unreadable_run() -> None:
    text = render_runs(
        [
            RunLine(run="a", state="finished", enqueued=10, committed=10, output="file:///out/a"),
            RunLine(
                run="qwen-think-v1",
                state="paused",
                enqueued=2_000,
                committed=500,
                dead_lettered=3,
                paused_by="quality-gate",
                output="s3://b/runs/qwen-think-v1",
            ),
            RunLine(run="old", state="unreadable", problem="its pinned settings are unreadable"),
        ]
    )
    header, first, second, third = text.splitlines()
    assert header.split() == ["RUN", "STATE", "COMMITTED", "DEAD", "OUTPUT"]
    assert first.split() == ["a", "finished", "10/10", "100.0%", "0", "file:///out/a"]
    assert "paused (quality-gate)" in second and "500/2,000 25.0%" in second
    assert second.endswith("s3://b/runs/qwen-think-v1")
    assert third.endswith("its pinned settings are unreadable")
    assert len({line.index(line.split()[-1]) for line in (header, first, second)}) == 1  # OUTPUT aligned
