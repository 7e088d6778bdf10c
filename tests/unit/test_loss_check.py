"""The loss-token check refuses a dataset whose rows carry too few loss tokens, and says why."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from core.records import Quality
from producer.errors import SettingsError
from producer.export import loss_check
from producer.export.loss_check import (
    DEFAULT_MAX_SHORT_FRACTION,
    DEFAULT_MIN_LOSS_TOKENS,
    LossCheckSettings,
    LossPercentiles,
    LossStats,
    ShortRowCause,
)

HEALTHY_TOKENS = 3_000  # loss tokens of a reasoned answer
THINKING_OFF_TOKENS = 6  # an empty think block and "OK."
FEW_ROWS, MANY_ROWS = 1_000, 100_000
FLAT_MEMORY_BYTES = 10_000  # what 100K more rows of known counts may add, at most


def stats_of(*groups: tuple[int, int, Quality, int | None]) -> LossStats:
    """Rows given as (how many, loss tokens, quality, reasoning tokens)."""
    stats = LossStats()
    for rows, count, quality, reasoning in groups:
        for _ in range(rows):
            stats.add(count, quality, reasoning_tokens=reasoning)
    return stats


def add_rows(stats: LossStats, rows: int) -> None:
    for index in range(rows):
        stats.add(index % DEFAULT_MIN_LOSS_TOKENS, Quality.OK, reasoning_tokens=0)


def test_the_defaults_are_32_tokens_and_five_percent() -> None:
    settings = LossCheckSettings()
    assert (settings.min_loss_tokens, settings.max_short_fraction) == (32, 0.05)
    assert (DEFAULT_MIN_LOSS_TOKENS, DEFAULT_MAX_SHORT_FRACTION) == (32, 0.05)


def test_a_thinking_off_dataset_is_refused_with_advice_naming_thinking() -> None:
    # Thinking was not asked for, so the rows are labelled ok: only their reasoning length tells.
    stats = stats_of((87, THINKING_OFF_TOKENS, Quality.OK, 0), (13, HEALTHY_TOKENS, Quality.OK, 2_000))
    verdict = stats.verdict(LossCheckSettings())
    assert not verdict.passed
    assert verdict.cause is ShortRowCause.THINKING_OFF
    assert "thinking" in verdict.advice and "87 of 100 rows" in verdict.advice
    assert verdict.short_fraction == pytest.approx(0.87)
    assert verdict.describe().startswith("loss-token check refused: 87 of 100 rows (87.0%)")


def test_rows_too_short_to_hold_any_reasoning_point_at_thinking_without_reasoning_counts() -> None:
    stats = stats_of((87, THINKING_OFF_TOKENS, Quality.OK, None), (13, HEALTHY_TOKENS, Quality.OK, None))
    assert stats.verdict().cause is ShortRowCause.THINKING_OFF


def test_rows_labelled_no_reasoning_point_at_thinking_too() -> None:
    stats = stats_of((50, 10, Quality.NO_REASONING, None), (50, HEALTHY_TOKENS, Quality.OK, None))
    assert stats.verdict().cause is ShortRowCause.THINKING_OFF


def test_a_budget_too_small_is_named_when_short_rows_were_cut_off() -> None:
    stats = stats_of((30, 16, Quality.TRUNCATED_IN_THINKING, 16), (70, HEALTHY_TOKENS, Quality.OK, 2_000))
    verdict = stats.verdict()
    assert verdict.cause is ShortRowCause.TRUNCATED
    assert "max_tokens" in verdict.advice


def test_empty_answers_are_named_when_short_rows_have_no_answer() -> None:
    stats = stats_of((20, 20, Quality.EMPTY_ANSWER, 18), (80, HEALTHY_TOKENS, Quality.OK, 2_000))
    verdict = stats.verdict()
    assert verdict.cause is ShortRowCause.EMPTY_ANSWER
    assert "empty answers" in verdict.advice


def test_otherwise_the_advice_is_short_answers_to_short_prompts_with_the_figures() -> None:
    stats = stats_of((10, 20, Quality.OK, 12), (90, HEALTHY_TOKENS, Quality.OK, 2_000))
    verdict = stats.verdict()
    assert not verdict.passed
    assert verdict.cause is ShortRowCause.SHORT_ANSWER
    assert verdict.advice.startswith("short answers to short prompts")
    assert "10 of 100 rows (10.0%)" in verdict.advice and "median 20" in verdict.advice


def test_a_dataset_with_few_short_rows_passes_without_advice() -> None:
    stats = stats_of((4, 20, Quality.OK, 12), (96, HEALTHY_TOKENS, Quality.OK, 2_000))
    verdict = stats.verdict()
    assert verdict.passed and verdict.advice == ""
    assert (verdict.short_rows, verdict.rows) == (4, 100)


def test_the_minimum_decides_which_rows_are_short() -> None:
    stats = stats_of((50, 100, Quality.OK, 50), (50, HEALTHY_TOKENS, Quality.OK, 2_000))
    assert stats.verdict(LossCheckSettings(min_loss_tokens=32)).passed
    assert not stats.verdict(LossCheckSettings(min_loss_tokens=128)).passed
    assert stats.short_fraction(128) == pytest.approx(0.5)


def test_an_empty_dataset_is_refused() -> None:
    verdict = LossStats().verdict()
    assert not verdict.passed and verdict.percentiles is None
    assert "no rows" in verdict.advice


def test_percentiles_are_exact_not_bucketed() -> None:
    stats = LossStats()
    for count in range(1, 101):
        stats.add(count, Quality.OK)
    assert stats.percentiles() == LossPercentiles(p1=1, p5=5, p10=10, p50=50, p90=90, p99=99)


def test_the_histogram_uses_log2_buckets_up_to_65536_and_over() -> None:
    stats = LossStats()
    for count in (0, 1, 2, 3, 4, 7, 8, 65_535, 65_536, 200_000):
        stats.add(count, Quality.OK)
    buckets = {bucket.label: bucket.rows for bucket in stats.histogram()}
    assert list(buckets)[:5] == ["0", "1", "2-3", "4-7", "8-15"]
    assert (buckets["0"], buckets["1"], buckets["2-3"], buckets["4-7"], buckets["8-15"]) == (1, 1, 2, 2, 1)
    assert (buckets["32768-65535"], buckets["≥65536"]) == (1, 2)


def test_memory_does_not_grow_with_the_rows() -> None:
    stats = LossStats()
    add_rows(stats, FEW_ROWS)
    # Only what the loss check's own code holds: threads other tests left behind allocate meanwhile.
    own_code = [tracemalloc.Filter(True, loss_check.__file__)]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(own_code)
        add_rows(stats, MANY_ROWS)
        after = tracemalloc.take_snapshot().filter_traces(own_code)
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert stats.rows == FEW_ROWS + MANY_ROWS
    assert grown < FLAT_MEMORY_BYTES


def test_the_terminal_histogram_shows_bars_and_the_percentiles() -> None:
    stats = stats_of((87, THINKING_OFF_TOKENS, Quality.OK, 0), (13, HEALTHY_TOKENS, Quality.OK, 2_000))
    text = stats.render_text()
    lines = text.splitlines()
    assert lines[0] == "loss tokens per row (100 rows)"
    assert lines[1].split()[0] == "4-7" and "#" * 40 in lines[1] and "87 (87.0%)" in lines[1]
    assert lines[-1] == "p1 6 · p5 6 · p10 6 · p50 6 · p90 3,000 · p99 3,000"
    assert LossStats().render_text() == "loss tokens per row: no rows"


def test_the_summary_is_json_ready_for_the_export_record() -> None:
    stats = stats_of((87, THINKING_OFF_TOKENS, Quality.OK, 0), (13, HEALTHY_TOKENS, Quality.OK, 2_000))
    summary = stats.summary(LossCheckSettings())
    assert json.loads(json.dumps(summary)) == summary
    assert (summary["passed"], summary["cause"], summary["short_rows"]) == (False, "thinking_off", 87)
    assert summary["percentiles"] == {"p1": 6, "p5": 6, "p10": 6, "p50": 6, "p90": 3000, "p99": 3000}


def test_settings_out_of_range_are_refused() -> None:
    with pytest.raises(SettingsError):
        LossCheckSettings(min_loss_tokens=-1)
    with pytest.raises(SettingsError):
        LossCheckSettings(max_short_fraction=1.5)
