"""A run's report as pictures (PNG, matplotlib's Agg renderer) and one self-contained HTML page.

The page embeds the pictures, so it can be mailed or attached alone; the PNGs are also written beside it.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from core.records import Quality
from producer.report.figures import (
    PERCENT,
    IntArray,
    LengthStats,
    RunFigures,
    bucket_width_s,
    throughput_per_gpu,
)

FIGURE_SIZE_IN = (9.0, 4.8)
FIGURE_DPI = 110  # 990 x 528 pixels: sharp in a browser, small on disk
HISTOGRAM_BINS = 60
LOG_TICK_MULTIPLES = (1.0, 2.0, 5.0)
BAR_HEADROOM = 1.18  # room above the tallest bar for its label
PERCENT_AXIS_MAX = 102.0
LABEL_INSIDE_FROM_PERCENT = 50.0
LABEL_GAP_PERCENT = 1.0
S_PER_MIN = 60.0
PERCENT_SCALE = 100.0
S_PER_H = 3600.0
HOURS_AXIS_FROM_S = 3 * S_PER_H  # runs this long are drawn in hours,
MINUTES_AXIS_FROM_S = 3 * S_PER_MIN  # these in minutes, shorter ones in seconds
MARKERS_BELOW_POINTS = 40  # short series get a marker per bucket, so one bucket is still visible
MANY_LINES = 10  # beyond this the lines are thinner and take colours from a 20-colour cycle
LEGEND_ROWS_MAX = 16  # more GPUs than this get a second legend column
GOOD_COLOUR = "#2e7d32"
BAD_COLOUR = "#c62828"
BAR_COLOUR = "#3f6fb5"
THINKING_COLOUR = "#6a51a3"
ANSWER_COLOUR = "#238b45"
MARK_STYLES = (("mean", "-", "#d62728"), ("median", "--", "#111111"), ("p95", ":", "#ff7f0e"))
NO_DATA = "no completions committed yet"

PICTURES = {
    "thinking": "thinking_lengths.png",
    "answer": "answer_lengths.png",
    "finish": "finish_reasons.png",
    "quality": "quality.png",
    "throughput": "throughput_per_gpu.png",
}
HTML_NAME = "report.html"


def _new_figure() -> tuple[Figure, Axes]:
    figure = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.subplots()


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path, dpi=FIGURE_DPI)
    return path


def _thousands(value: float, _position: object = None) -> str:
    return f"{value:,.0f}"


def _no_data(axes: Axes, message: str = NO_DATA) -> None:
    axes.text(0.5, 0.5, message, transform=axes.transAxes, ha="center", va="center", color="grey")
    axes.set_xticks([])
    axes.set_yticks([])


def length_histogram(values: IntArray, stats: LengthStats, *, what: str, colour: str, path: Path) -> Path:
    """Completions by length on a log axis, mean, median and p95 marked; zero lengths counted aside."""
    figure, axes = _new_figure()
    axes.set_title(f"{what.capitalize()} length per completion ({stats.count:,} completions)")
    positive = values[values > 0]
    if positive.size == 0:
        _no_data(axes, NO_DATA if stats.count == 0 else f"every completion has 0 {what} tokens")
    else:
        low, high = float(positive.min()), float(positive.max())
        bins = np.geomspace(
            max(low * 0.95, 1.0), high * 1.05 if high > low else low * 1.1 + 1, HISTOGRAM_BINS
        )
        axes.hist(positive, bins=bins.tolist(), color=colour, edgecolor="white", linewidth=0.4)
        axes.set_xscale("log")
        axes.xaxis.set_major_locator(LogLocator(base=10, subs=LOG_TICK_MULTIPLES))
        axes.xaxis.set_major_formatter(FuncFormatter(_thousands))
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.yaxis.set_major_formatter(FuncFormatter(_thousands))
        for name, style, line_colour in MARK_STYLES:
            value = getattr(stats, name)
            if value > 0:
                axes.axvline(
                    value, linestyle=style, color=line_colour, linewidth=1.6, label=f"{name} {value:,.0f}"
                )
        if stats.zeros:  # a log axis cannot draw them: the legend says how many there are
            share = stats.zeros / stats.count * PERCENT
            axes.add_artist(
                Rectangle(
                    (0, 0), 0, 0, visible=False, label=f"0 tokens (not drawn): {stats.zeros:,} ({share:.1f}%)"
                )
            )
        axes.legend(loc="best", title="all completions", frameon=True)
    axes.set_xlabel(f"{what} tokens per completion (log scale)")
    axes.set_ylabel("completions")
    return _save(figure, path)


def finish_reasons_bar(figures: RunFigures, path: Path) -> Path:
    figure, axes = _new_figure()
    axes.set_title(f"Finish reasons ({figures.completions:,} completions)")
    if not figures.finish_reasons:
        _no_data(axes)
        return _save(figure, path)
    reasons = list(figures.finish_reasons)
    counts = [figures.finish_reasons[reason] for reason in reasons]
    bars = axes.bar(reasons, counts, color=BAR_COLOUR, width=0.6)
    axes.bar_label(
        bars,
        labels=[
            f"{count:,}\n({figures.finish_rate(r):.1f}%)" for r, count in zip(reasons, counts, strict=True)
        ],
        padding=3,
    )
    axes.set_ylim(0, max(counts) * BAR_HEADROOM)
    axes.yaxis.set_major_formatter(FuncFormatter(_thousands))
    axes.set_xlabel("finish_reason (stop: ended by the model; length: hit max_tokens)")
    axes.set_ylabel("completions")
    return _save(figure, path)


def quality_bar(figures: RunFigures, path: Path) -> Path:
    """Share of completions per quality label, in percent, as horizontal bars (the labels are long)."""
    figure, axes = _new_figure()
    axes.set_title(f"Quality labels, % of {figures.completions:,} completions")
    if figures.completions == 0:
        _no_data(axes)
        return _save(figure, path)
    labels = list(reversed(figures.quality))  # barh draws bottom-up: keep `ok` on top
    rates = [figures.quality_rate(label) for label in labels]
    colours = [GOOD_COLOUR if label == Quality.OK.value else BAD_COLOUR for label in labels]
    axes.barh(labels, rates, color=colours, height=0.6)
    for row, (label, rate) in enumerate(zip(labels, rates, strict=True)):
        text = f"{rate:.1f}%  ({figures.quality[label]:,})"
        if rate >= LABEL_INSIDE_FROM_PERCENT:  # a long bar carries its label inside, clear of the frame
            axes.text(
                rate - LABEL_GAP_PERCENT, row, text, ha="right", va="center", color="white", weight="bold"
            )
        else:
            axes.text(rate + LABEL_GAP_PERCENT, row, text, ha="left", va="center")
    axes.set_xlim(0, PERCENT_AXIS_MAX)
    axes.set_xticks(np.arange(0, PERCENT + 1, 20))
    axes.set_xlabel("% of completions")
    axes.grid(axis="x", alpha=0.3)
    return _save(figure, path)


def throughput_lines(figures: RunFigures, path: Path) -> Path:
    """Output tokens per minute over the run, one line per GPU, by the completions' finish time."""
    figure, axes = _new_figure()
    bucket_s = bucket_width_s(figures.span_s)
    axes.set_title(f"Output tokens per minute per GPU (by finish time, {_duration(bucket_s)} buckets)")
    series = throughput_per_gpu(figures, bucket_s)
    if not series:
        _no_data(axes)
        return _save(figure, path)
    scale, unit = _time_axis(figures.span_s)
    many = len(series) > MANY_LINES
    colours = matplotlib.color_sequences["tab20" if many else "tab10"]
    for index, line in enumerate(series):
        marker = "o" if line.bucket_start_s.size < MARKERS_BELOW_POINTS else None
        axes.plot(
            (line.bucket_start_s + bucket_s / 2) / scale,
            line.tokens_per_minute,
            label=line.label,
            marker=marker,
            markersize=4,
            linewidth=1.0 if many else 1.5,
            color=colours[index % len(colours)],
        )
    axes.set_xlabel(f"time since the run's first request ({unit})")
    axes.set_ylabel("output tokens per minute")
    axes.set_ylim(bottom=0)
    axes.set_xlim(left=0)
    axes.yaxis.set_major_formatter(FuncFormatter(_thousands))
    axes.grid(alpha=0.3)
    columns = math.ceil(len(series) / LEGEND_ROWS_MAX)
    figure.legend(loc="outside right upper", title="host/GPU", fontsize="small", ncols=columns)
    return _save(figure, path)


def _time_axis(span_s: float) -> tuple[float, str]:
    """Seconds per unit of the throughput picture's x axis, and the unit's name, for a run this long."""
    if span_s >= HOURS_AXIS_FROM_S:
        return S_PER_H, "hours"
    if span_s >= MINUTES_AXIS_FROM_S:
        return S_PER_MIN, "minutes"
    return 1.0, "seconds"


def render_pictures(figures: RunFigures, out_dir: Path) -> dict[str, Path]:
    """Every picture of the report, as PNG files in `out_dir`, by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    samples = figures.samples
    return {
        "thinking": length_histogram(
            samples.thinking_tokens,
            figures.thinking,
            what="thinking",
            colour=THINKING_COLOUR,
            path=out_dir / PICTURES["thinking"],
        ),
        "answer": length_histogram(
            samples.answer_tokens,
            figures.answer,
            what="answer",
            colour=ANSWER_COLOUR,
            path=out_dir / PICTURES["answer"],
        ),
        "finish": finish_reasons_bar(figures, out_dir / PICTURES["finish"]),
        "quality": quality_bar(figures, out_dir / PICTURES["quality"]),
        "throughput": throughput_lines(figures, out_dir / PICTURES["throughput"]),
    }


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < S_PER_MIN:
        return f"{whole} s"
    hours, rest = divmod(whole, int(S_PER_H))
    minutes, secs = divmod(rest, int(S_PER_MIN))
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if secs else f"{minutes} min"


def _when(unix_s: float | None) -> str:
    if unix_s is None:
        return "–"
    return dt.datetime.fromtimestamp(unix_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class Row:
    name: str
    value: str


def _completions_in(figures: RunFigures) -> str:
    if figures.rows and figures.rows < figures.completions:
        turns = f"{figures.completions:,} assistant turns of {figures.rows:,} conversations"
        return f"{turns} in {figures.objects:,} objects"
    return f"{figures.completions:,} in {figures.objects:,} objects"


def summary_rows(figures: RunFigures) -> list[Row]:
    """The summary table, in reading order; also printed by the command."""
    rows = [
        Row("completions", _completions_in(figures)),
        Row(
            "span",
            f"{_duration(figures.span_s)} ({_when(figures.started_at)} to {_when(figures.finished_at)})",
        ),
        Row("prompt tokens", f"{figures.prompt_tokens:,}"),
        Row(
            "output tokens",
            f"{figures.completion_tokens:,} (thinking {figures.reasoning_tokens:,}, "
            f"answer {figures.answer_tokens:,})",
        ),
        Row("output tokens per minute", f"{figures.output_tokens_per_minute:,.0f} (all GPUs, whole span)"),
    ]
    for what, stats in (("thinking", figures.thinking), ("answer", figures.answer)):
        rows.append(
            Row(
                f"{what} tokens: mean / median / p95 / max",
                f"{stats.mean:,.0f} / {stats.median:,.0f} / {stats.p95:,.0f} / {stats.max:,}",
            )
        )
    rows.extend(
        Row(f"quality {label}", f"{figures.quality_rate(label):.1f}% ({count:,})")
        for label, count in figures.quality.items()
    )
    rows.extend(
        Row(f"finish {reason}", f"{figures.finish_rate(reason):.1f}% ({count:,})")
        for reason, count in figures.finish_reasons.items()
    )
    verdict = figures.loss.verdict()
    if verdict.rows:
        percentiles = verdict.percentiles
        spread = f"p5 {percentiles.p5:,} · p50 {percentiles.p50:,}" if percentiles is not None else "–"
        rows.append(Row("loss tokens of ok rows", spread))
        rows.append(
            Row(
                f"ok rows under {verdict.min_loss_tokens} loss tokens",
                f"{verdict.short_fraction * PERCENT_SCALE:.1f}% ({verdict.short_rows:,}): "
                + ("export passes" if verdict.passed else "export refuses"),
            )
        )
    if figures.dead_letters is None:
        rows.append(Row("dead letters", "unknown (the run's Redis was not reachable)"))
    elif not figures.dead_letters:
        rows.append(Row("dead letters", "0"))
    else:
        total = sum(figures.dead_letters.values())
        rows.append(Row("dead letters", f"{total:,}"))
        rows.extend(Row(f"dead: {reason}", f"{count:,}") for reason, count in figures.dead_letters.items())
    return rows


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int = 1) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if index >= numeric_from else ""}">{html.escape(cell)}</td>'
            for index, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _gpu_rows(figures: RunFigures) -> list[list[str]]:
    return [
        [
            gpu.label,
            f"{gpu.completions:,}",
            f"{gpu.output_tokens:,}",
            f"{gpu.tokens_per_minute:,.0f}",
            f"{gpu.mean_spec_accept_length:.2f}" if gpu.mean_spec_accept_length is not None else "–",
            _when(gpu.first_finished_at),
            _when(gpu.last_finished_at),
        ]
        for gpu in figures.gpus
    ]


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1040px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.8em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0; }
.note { color: #555; font-size: 0.9em; }
"""

_CAPTIONS = {
    "thinking": "Thinking (reasoning_tokens) per completion. A spike at the right edge is the max_tokens "
    "budget: thinking cut off there.",
    "answer": "Answer tokens (completion_tokens − reasoning_tokens) per completion; zero-length answers "
    "are counted in the box, since a log axis cannot show them.",
    "finish": "How completions ended: stop (the model finished) or length (max_tokens reached).",
    "quality": "Quality labels given at generation: ok is usable; the others name what is wrong.",
    "throughput": "Output tokens per minute per GPU, from each completion's finish time. A line falling "
    "to zero is a GPU that stopped delivering; the last point covers a partial bucket.",
}


def write_html(figures: RunFigures, pictures: dict[str, Path], path: Path, *, generated_at: float) -> Path:
    """One self-contained page: the summary, the per-GPU table, and every picture embedded."""
    sections = []
    for name, picture in pictures.items():
        encoded = base64.b64encode(picture.read_bytes()).decode("ascii")
        sections.append(
            f"<h2>{html.escape(picture.stem.replace('_', ' ').capitalize())}</h2>"
            f'<p class="note">{html.escape(_CAPTIONS[name])}</p>'
            f'<img alt="{html.escape(picture.stem)}" src="data:image/png;base64,{encoded}">'
        )
    summary = _table(["figure", "value"], [[row.name, row.value] for row in summary_rows(figures)])
    gpus = _table(
        [
            "host/GPU",
            "completions",
            "output tokens",
            "output tokens/min",
            "spec accept length",
            "first",
            "last",
        ],
        _gpu_rows(figures),
    )
    verdict = figures.loss.verdict()
    loss_advice = "" if verdict.passed else f"<p><strong>{html.escape(verdict.describe())}</strong></p>"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>draftgen report: {html.escape(figures.run)}</title><style>{_STYLE}</style></head>
<body>
<h1>Run {html.escape(figures.run)}</h1>
<p class="note">From the committed objects listed in the manifest of {html.escape(figures.store_url)};
generated {html.escape(_when(generated_at))}.</p>
<h2>Summary</h2>{summary}
<h2>Per GPU</h2>{gpus}
<h2>Loss tokens</h2>
<p class="note">What a drafter trainer computes loss on, per ok row (every generated token). `export`
refuses a dataset with too many short rows.</p>
<pre>{html.escape(figures.loss.render_text())}</pre>
{loss_advice}
{"".join(sections)}
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


def write_report(figures: RunFigures, out_dir: Path, *, generated_at: float) -> Path:
    """Pictures and the page into `out_dir`; returns the page's path."""
    pictures = render_pictures(figures, out_dir)
    return write_html(figures, pictures, out_dir / HTML_NAME, generated_at=generated_at)
