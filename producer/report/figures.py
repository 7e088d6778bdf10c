"""A run's figures, computed from its committed objects only: the manifest is the truth.

Objects are read one at a time and only their small columns (token counts, timings, origin, labels):
never the texts. What is kept per completion is four numbers (thinking and answer tokens, finish
time, GPU), so a run of a million completions needs a few tens of megabytes.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import redis

from core.records import DeadLetter, Origin, Quality
from producer.export.loss_check import LossStats
from workers.errors import RecordUnreadable
from workers.record.manifest import ManifestEntry, completion_keys, read_manifest
from workers.record.object_store import ObjectStore
from workers.record.parquet_io import PARQUET_USE_THREADS
from workers.state.codec import decode_json
from workers.state.keys import RunKeys
from workers.state.ledger import gpu_label
from workers.state.record_limits import SMALL_RECORD_LIMIT_BYTES

# Only these columns are read from each object: no text column is ever decoded.
REPORT_COLUMNS = ("finish_reason", "quality", "usage", "timings", "origin", "spec_accept_length")
EARLIER_TURNS = "earlier_turns"
EARLIER_TURN_COLUMNS = ("finish_reason", "quality", "usage", "timings", "spec_accept_length")
P95 = 95.0
PERCENT = 100.0
S_PER_MIN = 60.0
MAX_THROUGHPUT_BUCKETS = 100  # points per line at most in the throughput picture
BUCKET_WIDTHS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400)
DEAD_SCAN_COUNT = 1_000

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LengthStats:
    """A length distribution in tokens."""

    count: int
    zeros: int  # completions of length 0 (an answer cut off in thinking, or thinking off)
    mean: float
    median: float
    p95: float
    max: int

    @classmethod
    def of(cls, values: IntArray) -> LengthStats:
        if values.size == 0:
            return cls(count=0, zeros=0, mean=0.0, median=0.0, p95=0.0, max=0)
        return cls(
            count=int(values.size),
            zeros=int(np.count_nonzero(values == 0)),
            mean=float(values.mean()),
            median=float(np.median(values)),
            p95=float(np.percentile(values, P95)),
            max=int(values.max()),
        )


@dataclass(frozen=True)
class GpuFigures:
    """One origin (host and GPU) of the run's completions."""

    label: str  # `host/gpuN`, as in `status`
    completions: int
    output_tokens: int  # completion tokens: thinking and answer
    first_finished_at: float  # unix seconds
    last_finished_at: float
    mean_spec_accept_length: float | None  # speculative decoding, when the server reported it

    @property
    def tokens_per_minute(self) -> float:
        """Output tokens per minute over the span in which this GPU finished completions."""
        span_s = self.last_finished_at - self.first_finished_at
        return self.output_tokens / span_s * S_PER_MIN if span_s > 0 else 0.0


@dataclass(frozen=True)
class Samples:
    """Per-completion numbers the pictures are drawn from, in manifest order."""

    thinking_tokens: IntArray
    answer_tokens: IntArray
    output_tokens: IntArray
    finished_at: FloatArray  # unix seconds
    gpu: IntArray  # index into RunFigures.gpus


@dataclass(frozen=True)
class RunFigures:
    run: str
    store_url: str
    objects: int
    completions: int  # generated answers: a conversation regenerated turn by turn has one per turn
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    thinking: LengthStats
    answer: LengthStats
    finish_reasons: dict[str, int]
    quality: dict[str, int]  # every label, zero counts included
    started_at: float | None  # earliest request start, unix seconds
    finished_at: float | None  # latest completion
    gpus: list[GpuFigures]
    samples: Samples
    loss: LossStats  # loss tokens of the `ok` rows, the rows `export` hands over by default
    dead_letters: dict[str, int] | None = None  # by reason; None when Redis was not asked or reachable
    rows: int = 0  # committed rows: prompts, or whole conversations, each one row

    @property
    def answer_tokens(self) -> int:
        return self.completion_tokens - self.reasoning_tokens

    @property
    def span_s(self) -> float:
        if self.started_at is None or self.finished_at is None:
            return 0.0
        return self.finished_at - self.started_at

    @property
    def output_tokens_per_minute(self) -> float:
        return self.completion_tokens / self.span_s * S_PER_MIN if self.span_s > 0 else 0.0

    def quality_rate(self, label: str) -> float:
        """Share of completions with this label, in percent."""
        return self.quality.get(label, 0) / self.completions * PERCENT if self.completions else 0.0

    def finish_rate(self, reason: str) -> float:
        return self.finish_reasons.get(reason, 0) / self.completions * PERCENT if self.completions else 0.0


@dataclass
class _Accumulator:
    """Folds one object's columns at a time into running totals and compact per-completion arrays."""

    objects: int = 0
    rows: int = 0
    prompt_tokens: int = 0
    finish_reasons: Counter[str] = field(default_factory=Counter)
    quality: Counter[str] = field(default_factory=Counter)
    started_at: float | None = None
    origins: dict[tuple[str, int | None, str], int] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    spec_sum: list[float] = field(default_factory=list)
    spec_count: list[int] = field(default_factory=list)
    chunks: list[tuple[IntArray, IntArray, FloatArray, IntArray]] = field(default_factory=list)
    loss: LossStats = field(default_factory=LossStats)

    def _gpu_code(self, host: str, gpu: int | None, server_url: str) -> int:
        key = (host, gpu, server_url)
        code = self.origins.get(key)
        if code is None:
            label = gpu_label(Origin(host=host, gpu=gpu, server_url=server_url))
            if label in self.labels:  # one GPU seen under two server URLs still counts once
                code = self.labels.index(label)
            else:
                code = len(self.labels)
                self.labels.append(label)
                self.spec_sum.append(0.0)
                self.spec_count.append(0)
            self.origins[key] = code
        return code

    def add(self, table: pa.Table, rows: int) -> None:
        """One object's turns (`table`, see read_report_columns) and its committed rows."""
        self.objects += 1
        self.rows += rows
        if table.num_rows == 0:
            return
        usage = table.column("usage").combine_chunks()
        timings = table.column("timings").combine_chunks()
        origin = table.column("origin").combine_chunks()
        completion = _ints(usage.field("completion_tokens"))
        reasoning = _ints(usage.field("reasoning_tokens"))
        self.prompt_tokens += int(_ints(usage.field("prompt_tokens")).sum())
        started = _floats(timings.field("started_at"))
        self.started_at = min(float(started.min()), self.started_at or math.inf)
        gpu = np.fromiter(
            (
                self._gpu_code(host, gpu, url)
                for host, gpu, url in zip(
                    origin.field("host").to_pylist(),
                    origin.field("gpu").to_pylist(),
                    origin.field("server_url").to_pylist(),
                    strict=True,
                )
            ),
            dtype=np.int64,
            count=table.num_rows,
        )
        spec = table.column("spec_accept_length").combine_chunks()
        spec_values = spec.fill_null(math.nan).to_numpy(zero_copy_only=False).astype(np.float64)
        reported = ~np.isnan(spec_values)
        for code in np.unique(gpu[reported]):
            mine = reported & (gpu == code)
            self.spec_sum[int(code)] += float(spec_values[mine].sum())
            self.spec_count[int(code)] += int(np.count_nonzero(mine))
        self.finish_reasons.update(Counter(table.column("finish_reason").to_pylist()))
        qualities = table.column("quality").to_pylist()
        self.quality.update(Counter(qualities))
        # A trainer's loss covers every generated token: usage.completion_tokens, which SGLang counts
        # as the response ids it returns, so the text and id columns stay unread.
        for label, tokens, thought in zip(qualities, completion.tolist(), reasoning.tolist(), strict=True):
            if label == Quality.OK.value:
                self.loss.add(tokens, Quality.OK, reasoning_tokens=thought)
        self.chunks.append((reasoning, completion - reasoning, _floats(timings.field("finished_at")), gpu))

    def figures(self, run: str, store_url: str, dead_letters: dict[str, int] | None) -> RunFigures:
        thinking = np.concatenate([chunk[0] for chunk in self.chunks] or [np.zeros(0, np.int64)])
        answer = np.concatenate([chunk[1] for chunk in self.chunks] or [np.zeros(0, np.int64)])
        finished = np.concatenate([chunk[2] for chunk in self.chunks] or [np.zeros(0, np.float64)])
        gpu = np.concatenate([chunk[3] for chunk in self.chunks] or [np.zeros(0, np.int64)])
        samples = Samples(
            thinking_tokens=thinking,
            answer_tokens=answer,
            output_tokens=thinking + answer,
            finished_at=finished,
            gpu=gpu,
        )
        return RunFigures(
            run=run,
            store_url=store_url,
            objects=self.objects,
            rows=self.rows,
            completions=int(samples.gpu.size),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=int(samples.output_tokens.sum()),
            reasoning_tokens=int(samples.thinking_tokens.sum()),
            thinking=LengthStats.of(samples.thinking_tokens),
            answer=LengthStats.of(samples.answer_tokens),
            finish_reasons=dict(self.finish_reasons.most_common()),
            quality=self._quality_counts(),
            started_at=self.started_at,
            finished_at=float(samples.finished_at.max()) if samples.finished_at.size else None,
            gpus=self._gpu_figures(samples),
            samples=samples,
            loss=self.loss,
            dead_letters=dead_letters,
        )

    def _quality_counts(self) -> dict[str, int]:
        """Every known label in a fixed order (zeros too), then any label this code does not know."""
        known = [label.value for label in Quality]
        unknown = sorted(set(self.quality) - set(known))
        return {label: self.quality.get(label, 0) for label in [*known, *unknown]}

    def _gpu_figures(self, samples: Samples) -> list[GpuFigures]:
        gpus: list[GpuFigures] = []
        for code, label in enumerate(self.labels):
            mine = samples.gpu == code
            finished = samples.finished_at[mine]
            gpus.append(
                GpuFigures(
                    label=label,
                    completions=int(np.count_nonzero(mine)),
                    output_tokens=int(samples.output_tokens[mine].sum()),
                    first_finished_at=float(finished.min()),
                    last_finished_at=float(finished.max()),
                    mean_spec_accept_length=(
                        self.spec_sum[code] / self.spec_count[code] if self.spec_count[code] else None
                    ),
                )
            )
        return gpus


def _ints(array: pa.Array) -> IntArray:
    return np.asarray(array.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _floats(array: pa.Array) -> FloatArray:
    return np.asarray(array.fill_null(math.nan).to_numpy(zero_copy_only=False), dtype=np.float64)


def read_report_columns(data: bytes) -> tuple[pa.Table, int]:
    """The columns the report needs from one committed object, one row per generated turn (a
    conversation's earlier turns follow the rows, with their row's origin), and its committed rows.
    The texts stay unread."""
    file = pq.ParquetFile(io.BytesIO(data))
    rows = file.read(columns=list(REPORT_COLUMNS), use_threads=PARQUET_USE_THREADS)
    if EARLIER_TURNS not in file.schema_arrow.names:  # written before conversations were regenerated
        return rows, rows.num_rows
    paths = [f"{EARLIER_TURNS}.list.element.{name}" for name in EARLIER_TURN_COLUMNS]
    turns_column = file.read(columns=paths, use_threads=PARQUET_USE_THREADS).column(EARLIER_TURNS)
    earlier = pc.list_flatten(turns_column)
    if len(earlier) == 0:
        return rows, rows.num_rows
    parents = pc.list_parent_indices(turns_column)
    turns = pa.table(
        {
            **{name: earlier.combine_chunks().field(name) for name in EARLIER_TURN_COLUMNS},
            "origin": rows.column("origin").take(parents),
        }
    )
    return pa.concat_tables([rows, turns.select(list(REPORT_COLUMNS))]), rows.num_rows


def compute_figures(
    store: ObjectStore,
    run: str,
    *,
    dead_letters: dict[str, int] | None = None,
    entries: Iterable[ManifestEntry] | None = None,
    on_object: Callable[[int, int], None] | None = None,
) -> RunFigures:
    """Read every object the manifest names, one at a time, and fold it into the run's figures."""
    listed = completion_keys(list(read_manifest(store) if entries is None else entries))
    totals = _Accumulator()
    for index, key in enumerate(listed, start=1):
        totals.add(*read_report_columns(store.get(key)))
        if on_object is not None:
            on_object(index, len(listed))
    return totals.figures(run, store.url, dead_letters)


def dead_letters_by_reason(client: redis.Redis, run: str) -> dict[str, int]:
    """Counts of the run's dead letters by reason, from its `dead` hash."""
    reasons: Counter[str] = Counter()
    for _prompt_id, raw in client.hscan_iter(RunKeys(run).dead, count=DEAD_SCAN_COUNT):
        try:
            reasons[decode_json(raw, DeadLetter, limit_bytes=SMALL_RECORD_LIMIT_BYTES).reason] += 1
        except RecordUnreadable as error:  # the uploader quarantines it if it is pending
            reasons[error.reason] += 1
    return dict(reasons.most_common())


def bucket_width_s(span_s: float) -> int:
    """The narrowest bucket from a round ladder that draws the span in at most MAX_THROUGHPUT_BUCKETS."""
    for width in BUCKET_WIDTHS_S:
        if span_s / width <= MAX_THROUGHPUT_BUCKETS:
            return width
    return math.ceil(span_s / MAX_THROUGHPUT_BUCKETS)


@dataclass(frozen=True)
class ThroughputSeries:
    label: str
    bucket_start_s: FloatArray  # seconds since the run's start
    tokens_per_minute: FloatArray  # output tokens finished in the bucket, per minute


def throughput_per_gpu(figures: RunFigures, bucket_s: int) -> list[ThroughputSeries]:
    """Output tokens per minute in buckets of `bucket_s` by finish time, one series per GPU.

    Every series spans the whole run (empty buckets are zero), so a GPU that stalls shows a drop.
    """
    if figures.started_at is None or figures.completions == 0:
        return []
    samples = figures.samples
    offsets = samples.finished_at - figures.started_at
    buckets = math.floor(figures.span_s / bucket_s) + 1
    index = np.clip((offsets // bucket_s).astype(np.int64), 0, buckets - 1)
    starts = np.arange(buckets, dtype=np.float64) * bucket_s
    series: list[ThroughputSeries] = []
    for code, gpu in enumerate(figures.gpus):
        mine = samples.gpu == code
        tokens = np.bincount(index[mine], weights=samples.output_tokens[mine], minlength=buckets)
        series.append(ThroughputSeries(gpu.label, starts, tokens.astype(np.float64) * S_PER_MIN / bucket_s))
    return series
