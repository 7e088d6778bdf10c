"""The loss-token check of an export: refuse a dataset whose rows teach a drafter almost nothing.

A drafter learns only on loss-bearing tokens. One dataset had 914K rows, 87% of them with exactly 6
loss tokens: thinking was off, and each row was an empty think block and "OK.". Its row count looked
healthy; its loss tokens did not. `LossStats` takes one row's loss-token count at a time (memory
bounded by the number of distinct counts, not of rows), and `verdict` refuses the dataset when too
many rows fall under a minimum, naming the likely cause from the short rows' labels.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass

from core.records import Quality
from producer.errors import SettingsError

DEFAULT_MIN_LOSS_TOKENS = 32
DEFAULT_MAX_SHORT_FRACTION = 0.05
TINY_REASONING_TOKENS = 8  # reasoning of at most this many tokens means thinking was off
# A whole loss span this short holds no reasoning: the think block's markers and a word or two.
NO_ROOM_FOR_THINKING_TOKENS = 8
DETAIL_LIMIT_TOKENS = 4096  # rows under this many loss tokens are kept by cause too
MOSTLY = 0.5  # share of the short rows above which one cause is named as the likely one
TOP_BUCKET_BITS = 17  # the last log2 bucket holds every count from 2**16 = 65536 tokens up
PERCENTILES = (1, 5, 10, 50, 90, 99)
PERCENT = 100.0
MEDIAN = 50.0
BAR_WIDTH = 40  # characters of the longest histogram bar
BAR = "#"


class ShortRowCause(enum.StrEnum):
    """What a row's labels say about why it could be short."""

    THINKING_OFF = "thinking_off"  # no reasoning, or a few tokens of it
    TRUNCATED = "truncated"  # cut off by the token budget
    EMPTY_ANSWER = "empty_answer"  # ended with nothing in the answer
    SHORT_ANSWER = "short_answer"  # a finished, reasoned answer that is simply short


@dataclass(frozen=True)
class LossCheckSettings:
    min_loss_tokens: int = DEFAULT_MIN_LOSS_TOKENS  # a row with fewer loss tokens is short
    max_short_fraction: float = DEFAULT_MAX_SHORT_FRACTION  # of all rows, at most

    def __post_init__(self) -> None:
        if not 0 <= self.min_loss_tokens <= DETAIL_LIMIT_TOKENS:
            raise SettingsError(
                f"min_loss_tokens is {self.min_loss_tokens}; it must be 0 to {DETAIL_LIMIT_TOKENS}"
            )
        if not 0.0 <= self.max_short_fraction <= 1.0:
            raise SettingsError(f"max_short_fraction is {self.max_short_fraction}; it must be 0 to 1")


@dataclass(frozen=True)
class LossHistogramBucket:
    low: int  # loss tokens, inclusive
    high: int | None  # inclusive; None for the open last bucket
    rows: int

    @property
    def label(self) -> str:
        if self.high is None:
            return f"≥{self.low}"
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(frozen=True)
class LossPercentiles:
    """Loss tokens per row at each percentile (nearest rank, exact)."""

    p1: int
    p5: int
    p10: int
    p50: int
    p90: int
    p99: int

    def as_dict(self) -> dict[str, int]:
        values = (self.p1, self.p5, self.p10, self.p50, self.p90, self.p99)
        return {f"p{p}": value for p, value in zip(PERCENTILES, values, strict=True)}

    def text(self) -> str:
        return " · ".join(f"{name} {value:,}" for name, value in self.as_dict().items())


@dataclass(frozen=True)
class LossVerdict:
    passed: bool
    rows: int
    short_rows: int  # rows under `min_loss_tokens`
    short_fraction: float
    min_loss_tokens: int
    max_short_fraction: float
    percentiles: LossPercentiles | None  # None without rows
    cause: ShortRowCause | None  # the likely cause of the short rows, when one dominates
    advice: str  # "" when passed

    def describe(self) -> str:
        """One line of figures, then the advice when refused: the CLI's message."""
        outcome = "passed" if self.passed else "refused"
        figures = (
            f"loss-token check {outcome}: {self.short_rows:,} of {self.rows:,} rows "
            f"({self.short_fraction:.1%}) have fewer than {self.min_loss_tokens} loss tokens "
            f"(at most {self.max_short_fraction:.1%} allowed)"
        )
        return f"{figures}. {self.advice}" if self.advice else figures


class LossStats:
    """Loss tokens per row, accumulated row by row over any number of rows."""

    def __init__(self) -> None:
        self._counts: Counter[int] = Counter()  # loss tokens -> rows
        self._short: Counter[tuple[int, ShortRowCause]] = Counter()  # under DETAIL_LIMIT_TOKENS
        self._rows = 0

    @property
    def rows(self) -> int:
        return self._rows

    def add(self, count: int, quality: Quality, *, reasoning_tokens: int | None = None) -> None:
        """One row: its loss tokens and quality label. Pass `usage.reasoning_tokens` where known: a
        run with thinking off is labelled `ok` (no thinking was asked for), and only its reasoning
        length tells it apart from short reasoned answers; without it, only rows too short to hold
        any reasoning (`NO_ROOM_FOR_THINKING_TOKENS`) count as thinking off."""
        if count < 0:
            raise ValueError(f"a row cannot have {count} loss tokens")
        self._counts[count] += 1
        self._rows += 1
        if count < DETAIL_LIMIT_TOKENS:
            self._short[count, _cause(count, quality, reasoning_tokens)] += 1

    def histogram(self) -> list[LossHistogramBucket]:
        """Rows per log2 bucket of loss tokens: 0, 1, 2-3, 4-7, ... 32768-65535, ≥65536."""
        rows = [0] * (TOP_BUCKET_BITS + 1)
        for count, n in self._counts.items():
            rows[min(count.bit_length(), TOP_BUCKET_BITS)] += n
        buckets = [LossHistogramBucket(0, 0, rows[0])]
        for bits in range(1, TOP_BUCKET_BITS):
            buckets.append(LossHistogramBucket(2 ** (bits - 1), 2**bits - 1, rows[bits]))
        buckets.append(LossHistogramBucket(2 ** (TOP_BUCKET_BITS - 1), None, rows[TOP_BUCKET_BITS]))
        return buckets

    def percentiles(self) -> LossPercentiles | None:
        if not self._rows:
            return None
        return LossPercentiles(*(_nearest_rank(self._counts, p) for p in PERCENTILES))

    def short_fraction(self, min_loss_tokens: int = DEFAULT_MIN_LOSS_TOKENS) -> float:
        """Share of the rows with fewer than `min_loss_tokens` loss tokens."""
        short = sum(n for count, n in self._counts.items() if count < min_loss_tokens)
        return short / self._rows if self._rows else 0.0

    def verdict(self, settings: LossCheckSettings | None = None) -> LossVerdict:
        settings = LossCheckSettings() if settings is None else settings
        short_lengths: Counter[int] = Counter()
        by_cause: Counter[ShortRowCause] = Counter()
        for (count, row_cause), n in self._short.items():
            if count < settings.min_loss_tokens:
                short_lengths[count] += n
                by_cause[row_cause] += n
        short_rows = short_lengths.total()
        fraction = short_rows / self._rows if self._rows else 0.0
        passed = self._rows > 0 and fraction <= settings.max_short_fraction
        cause = _likely_cause(by_cause)
        advice = "" if passed else _advice(self._rows, short_lengths, by_cause, cause, settings)
        return LossVerdict(
            passed=passed,
            rows=self._rows,
            short_rows=short_rows,
            short_fraction=fraction,
            min_loss_tokens=settings.min_loss_tokens,
            max_short_fraction=settings.max_short_fraction,
            percentiles=self.percentiles(),
            cause=cause,
            advice=advice,
        )

    def summary(self, settings: LossCheckSettings | None = None) -> dict[str, object]:
        """The figures as JSON-ready values, for an export's record."""
        verdict = self.verdict(settings)
        percentiles = verdict.percentiles
        return {
            "rows": verdict.rows,
            "min_loss_tokens": verdict.min_loss_tokens,
            "max_short_fraction": verdict.max_short_fraction,
            "short_rows": verdict.short_rows,
            "short_fraction": verdict.short_fraction,
            "passed": verdict.passed,
            "cause": None if verdict.cause is None else verdict.cause.value,
            "percentiles": None if percentiles is None else percentiles.as_dict(),
            "histogram": {bucket.label: bucket.rows for bucket in self.histogram()},
        }

    def render_text(self) -> str:
        """A compact terminal histogram (bars of `#`) and the percentiles line."""
        percentiles = self.percentiles()
        if percentiles is None:
            return "loss tokens per row: no rows"
        buckets = self.histogram()
        filled = [index for index, bucket in enumerate(buckets) if bucket.rows]
        shown = buckets[filled[0] : filled[-1] + 1]
        widest = max(bucket.rows for bucket in shown)
        label_width = max(len(bucket.label) for bucket in shown)
        lines = [f"loss tokens per row ({self._rows:,} rows)"]
        for bucket in shown:
            bar = BAR * (math.ceil(bucket.rows * BAR_WIDTH / widest) if bucket.rows else 0)
            share = bucket.rows / self._rows
            lines.append(f"{bucket.label:>{label_width}} {bar:<{BAR_WIDTH}} {bucket.rows:,} ({share:.1%})")
        lines.append(percentiles.text())
        return "\n".join(lines)


def _cause(count: int, quality: Quality, reasoning_tokens: int | None) -> ShortRowCause:
    if quality in (Quality.TRUNCATED_IN_THINKING, Quality.TRUNCATED_IN_ANSWER):
        return ShortRowCause.TRUNCATED
    if quality is Quality.EMPTY_ANSWER:
        return ShortRowCause.EMPTY_ANSWER
    if quality is Quality.NO_REASONING:
        return ShortRowCause.THINKING_OFF
    if reasoning_tokens is not None and reasoning_tokens <= TINY_REASONING_TOKENS:
        return ShortRowCause.THINKING_OFF
    if reasoning_tokens is None and count <= NO_ROOM_FOR_THINKING_TOKENS:
        return ShortRowCause.THINKING_OFF
    return ShortRowCause.SHORT_ANSWER


def _nearest_rank(counts: Counter[int], percentile: float) -> int:
    rank = max(1, math.ceil(percentile / PERCENT * counts.total()))
    seen = 0
    for count in sorted(counts):
        seen += counts[count]
        if seen >= rank:
            return count
    raise ValueError("no rows")  # unreachable: rank <= total


def _likely_cause(by_cause: Counter[ShortRowCause]) -> ShortRowCause | None:
    if not by_cause:
        return None
    cause, rows = by_cause.most_common(1)[0]
    return cause if rows / by_cause.total() > MOSTLY else None


def _advice(
    rows: int,
    short_lengths: Counter[int],
    by_cause: Counter[ShortRowCause],
    cause: ShortRowCause | None,
    settings: LossCheckSettings,
) -> str:
    if not rows:
        return "there are no rows to train on"
    short = short_lengths.total()
    median = _nearest_rank(short_lengths, MEDIAN)
    share = by_cause[cause] / short if cause else 0.0
    figures = (
        f"{short:,} of {rows:,} rows ({short / rows:.1%}) have fewer than {settings.min_loss_tokens} "
        f"loss tokens, median {median:,}"
    )
    if cause is ShortRowCause.THINKING_OFF:
        return (
            f"thinking looks off: {figures}, and {share:.0%} of them have no reasoning. Check "
            "enable_thinking (the server may override it with --default-chat-template-kwargs), the "
            "model's chat template and --reasoning-parser, then generate again with thinking on"
        )
    if cause is ShortRowCause.TRUNCATED:
        return (
            f"the token budget is too small: {figures}, and {share:.0%} of them were cut off by "
            "max_tokens. Raise max_tokens (or the budget retries) and generate them again"
        )
    if cause is ShortRowCause.EMPTY_ANSWER:
        return (
            f"empty answers: {figures}, and {share:.0%} of them ended with nothing in the answer: "
            "the model stops inside its thinking. Check the chat template and stop strings, and "
            "drop these rows"
        )
    mix = ", ".join(f"{name} {n / short:.0%}" for name, n in by_cause.most_common())
    return (
        f"short answers to short prompts: {figures} ({mix}). Drop rows under the minimum, or add "
        "harder prompts"
    )
