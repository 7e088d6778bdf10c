"""Token ids in the committed Parquet, and export throughput.

1. Bytes per committed row with and without `prompt_token_ids`/`response_token_ids`, for rows whose
   ids follow a Zipf law over Qwen's 151,643-id vocabulary (text tokens are Zipf-like; s = 1.1) and,
   as an upper bound, uniformly random ids. The text is the ids spelled as words, so text and ids
   carry the same information, as real rows do.
2. `export` over a run of `--rows` committed rows (100 parts), from a folder to a folder: rows per
   second for speculators and specforge, both passes (check, then write) included.

    .venv/bin/python benchmarks/bench_export.py [--rows 100000]

Figures are ratios and rates measured side by side in one run; this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.records import Completion, Message, Origin, Quality, SamplingSettings, Timings, Usage
from producer.export.exporter import ExportSettings, run_export, scan_output
from producer.export.formats import ExportFormat
from producer.export.selection import DEFAULT_MAX_LENGTH_TOKENS, Selection
from producer.export.source import RunOutput
from tests.support.run_output import write_run_output
from workers.record.parquet_io import completions_to_parquet
from workers.record.storage import FolderStore

VOCABULARY = 151_643
ZIPF_EXPONENT = 1.1
ROWS_PER_PART = 1_000
SIZE_SAMPLE_ROWS = 1_000
THINKING_MEAN_TOKENS = 1_500
ANSWER_MEAN_TOKENS = 300
LENGTH_SIGMA = 0.6
PROMPT_TOKENS = 60
THINK_END, IM_END = 151_668, 151_645
SEED = 7


def draw_ids(rng: np.random.Generator, count: int, *, uniform: bool) -> list[int]:
    ids: list[int]
    if uniform:
        ids = rng.integers(0, VOCABULARY, count).tolist()
    else:
        ids = (np.minimum(rng.zipf(ZIPF_EXPONENT, count), VOCABULARY) - 1).tolist()
    return ids


def spelled(ids: list[int]) -> str:
    return " ".join(np.base_repr(i, 36).lower() for i in ids)


def lognormal(rng: np.random.Generator, mean: float) -> int:
    mu = np.log(mean) - LENGTH_SIGMA**2 / 2
    return max(1, int(rng.lognormal(mu, LENGTH_SIGMA)))


def make_row(rng: np.random.Generator, index: int, *, uniform: bool, with_ids: bool) -> Completion:
    prompt_ids = draw_ids(rng, PROMPT_TOKENS, uniform=uniform)
    thinking = draw_ids(rng, lognormal(rng, THINKING_MEAN_TOKENS), uniform=uniform)
    answer = draw_ids(rng, lognormal(rng, ANSWER_MEAN_TOKENS), uniform=uniform)
    response_ids = [*thinking, THINK_END, *answer, IM_END]
    return Completion(
        prompt_id=f"p{index}",
        messages=[Message(role="user", content=spelled(prompt_ids))],
        reasoning_content=spelled(thinking) + "\n",
        content="\n\n" + spelled(answer),
        finish_reason="stop",
        usage=Usage(
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(response_ids),
            reasoning_tokens=len(thinking) + 1,
        ),
        timings=Timings(started_at=1.0, finished_at=2.0, latency_s=1.0),
        model="Qwen/Qwen3.6-27B",
        sampling=SamplingSettings(model="Qwen/Qwen3.6-27B"),
        origin=Origin(host="node-1", gpu=0, server_url="http://10.0.0.7:30000", server="789741e33a72a5db"),
        attempt=1,
        quality=Quality.OK,
        prompt_token_ids=prompt_ids if with_ids else None,
        response_token_ids=response_ids if with_ids else None,
    )


def bytes_per_row() -> None:
    for name, uniform in (("zipf", False), ("uniform", True)):
        sizes = {}
        for with_ids in (False, True):
            rng = np.random.default_rng(SEED)  # the same rows, with and without their ids
            rows = [make_row(rng, i, uniform=uniform, with_ids=with_ids) for i in range(SIZE_SAMPLE_ROWS)]
            sizes[with_ids] = len(completions_to_parquet(rows)) / SIZE_SAMPLE_ROWS
        tokens = sum(r.usage.prompt_tokens + r.usage.completion_tokens for r in rows) / SIZE_SAMPLE_ROWS
        extra = sizes[True] - sizes[False]
        print(
            f"ids={name} tokens_per_row={tokens:,.0f} bytes_per_row_text_only={sizes[False]:,.0f} "
            f"bytes_per_row_with_ids={sizes[True]:,.0f} ids_cost={extra / sizes[False]:.2f}x_text "
            f"bytes_per_id={extra / tokens:.2f}"
        )


def export_throughput(rows: int) -> None:
    rng = np.random.default_rng(SEED)
    template = [make_row(rng, i, uniform=False, with_ids=True) for i in range(ROWS_PER_PART)]
    parts = [
        [msgspec.structs.replace(row, prompt_id=f"p{part}-{i}") for i, row in enumerate(template)]
        for part in range(max(1, rows // ROWS_PER_PART))
    ]
    with tempfile.TemporaryDirectory() as folder:
        url = write_run_output(Path(folder) / "run", "bench", parts)
        output = RunOutput(FolderStore(Path(url.removeprefix("file://"))), "bench")
        for fmt in (ExportFormat.SPECULATORS, ExportFormat.SPECFORGE):
            settings = ExportSettings(
                run="bench",
                format=fmt,
                selection=Selection(format=fmt, max_length=DEFAULT_MAX_LENGTH_TOKENS[fmt]),
            )
            started = time.perf_counter()
            scan = scan_output(output, settings)
            checked = time.perf_counter()
            result = run_export(output, FolderStore(Path(folder) / fmt.value), settings, scan)
            ended = time.perf_counter()
            written = sum(shard.bytes for shard in result.record.shards)
            kept = scan.counts.kept
            print(
                f"format={fmt.value} rows={kept} check_rows_per_s={kept / (checked - started):,.0f} "
                f"export_rows_per_s={kept / (ended - started):,.0f} jsonl_bytes_per_row={written / kept:,.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    bytes_per_row()
    export_throughput(args.rows)


if __name__ == "__main__":
    main()
