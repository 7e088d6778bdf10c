"""The run report: figures from the committed objects the manifest lists, pictures and an HTML page.

The objects are written with the project's own Parquet writer and committed with manifest entries,
as the uploader does, into a folder store.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from core.records import Completion, Message, Origin, Quality, SamplingSettings, Timings, Usage
from producer.cli import build_parser, main
from producer.report.figures import (
    REPORT_COLUMNS,
    RunFigures,
    bucket_width_s,
    compute_figures,
    dead_letters_by_reason,
    throughput_per_gpu,
)
from producer.report.render import FIGURE_DPI, FIGURE_SIZE_IN, HTML_NAME, PICTURES, summary_rows, write_report
from workers.record.manifest import ManifestEntry, data_key, encode_entry, manifest_key
from workers.record.object_store import ObjectStore
from workers.record.parquet_io import completions_to_parquet
from workers.record.storage import FolderStore
from workers.state.keys import RunKeys

RUN = "report-test"
T0 = 1_750_000_000.0  # the run's first request, unix seconds
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIN_PICTURE_BYTES = 5_000
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


def completion(
    prompt_id: str,
    *,
    host: str,
    gpu: int,
    reasoning: int,
    answer: int,
    finished_after_s: float,
    quality: Quality = Quality.OK,
    finish_reason: str = "stop",
    spec_accept_length: float | None = None,
) -> Completion:
    return Completion(
        prompt_id=prompt_id,
        messages=[Message(role="user", content=f"question {prompt_id}")],
        reasoning_content="thought " * reasoning,
        content="word " * answer,
        finish_reason=finish_reason,
        usage=Usage(prompt_tokens=10, completion_tokens=reasoning + answer, reasoning_tokens=reasoning),
        timings=Timings(started_at=T0, finished_at=T0 + finished_after_s, latency_s=finished_after_s),
        model="m",
        sampling=SamplingSettings(model="m"),
        origin=Origin(host=host, gpu=gpu, server_url=f"http://{host}:{30000 + gpu}"),
        attempt=1,
        quality=quality,
        spec_accept_length=spec_accept_length,
    )


PART_0 = [
    completion("a", host="h1", gpu=0, reasoning=100, answer=50, finished_after_s=10, spec_accept_length=3.0),
    completion("b", host="h1", gpu=0, reasoning=300, answer=100, finished_after_s=70, spec_accept_length=3.5),
    completion("c", host="h1", gpu=1, reasoning=200, answer=60, finished_after_s=20, spec_accept_length=2.0),
]
PART_1 = [
    completion(
        "d",
        host="h1",
        gpu=0,
        reasoning=1000,
        answer=0,
        finished_after_s=75,
        quality=Quality.TRUNCATED_IN_THINKING,
        finish_reason="length",
    ),
    completion(
        "e", host="h1", gpu=1, reasoning=0, answer=40, finished_after_s=130, quality=Quality.NO_REASONING
    ),
    completion(
        "f", host="h2", gpu=0, reasoning=500, answer=0, finished_after_s=65, quality=Quality.EMPTY_ANSWER
    ),
]
ORPHAN = [completion("orphan", host="h9", gpu=7, reasoning=9999, answer=9999, finished_after_s=500)]


def commit(store: ObjectStore, part: int, completions: list[Completion]) -> None:
    """Write an object and create its manifest entry: the uploader's commit."""
    data = completions_to_parquet(completions)
    sha256 = hashlib.sha256(data).hexdigest()
    key = data_key(part, sha256)
    store.put(key, data)
    entry = ManifestEntry(
        part=part, key=key, count=len(completions), bytes=len(data), sha256=sha256, committed_at=T0
    )
    assert store.put_if_absent(manifest_key(part), encode_entry(entry))


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    folder = FolderStore(tmp_path / "output")
    commit(folder, 0, PART_0)
    commit(folder, 1, PART_1)
    # An object of an interrupted flush: no manifest entry names it, so the report must not count it
    data = completions_to_parquet(ORPHAN)
    folder.put(data_key(2, hashlib.sha256(data).hexdigest()), data)
    return folder


@pytest.fixture
def figures(store: ObjectStore) -> RunFigures:
    return compute_figures(store, RUN, dead_letters={"rejected_by_server": 2, "max_attempts": 1})


def test_only_objects_named_by_the_manifest_are_counted(figures: RunFigures) -> None:
    assert figures.objects == 2
    assert figures.completions == 6
    assert {gpu.label for gpu in figures.gpus} == {"h1/gpu0", "h1/gpu1", "h2/gpu0"}


def test_token_totals_split_thinking_from_answer(figures: RunFigures) -> None:
    assert figures.prompt_tokens == 60
    assert figures.completion_tokens == 2350
    assert figures.reasoning_tokens == 2100
    assert figures.answer_tokens == 250


def test_length_figures_count_zero_lengths_and_mark_mean_median_and_p95(figures: RunFigures) -> None:
    # thinking: 100, 300, 200, 1000, 0, 500
    assert figures.thinking.count == 6
    assert figures.thinking.zeros == 1
    assert figures.thinking.mean == pytest.approx(350.0)
    assert figures.thinking.median == pytest.approx(250.0)
    assert figures.thinking.p95 == pytest.approx(875.0)  # between 500 and 1000, linear
    assert figures.thinking.max == 1000
    # answer: 50, 100, 60, 0, 40, 0
    assert figures.answer.zeros == 2
    assert figures.answer.mean == pytest.approx(250 / 6)
    assert figures.answer.median == pytest.approx(45.0)
    assert figures.answer.max == 100


def test_quality_rates_are_percent_of_completions_and_list_every_label(figures: RunFigures) -> None:
    assert list(figures.quality) == [label.value for label in Quality]
    assert figures.quality_rate("ok") == pytest.approx(50.0)
    assert figures.quality_rate("truncated_in_thinking") == pytest.approx(100 / 6)
    assert figures.quality_rate("empty_answer") == pytest.approx(100 / 6)
    assert figures.quality_rate("no_reasoning") == pytest.approx(100 / 6)
    assert figures.quality["truncated_in_answer"] == 0


def test_finish_reasons_are_counted_most_common_first(figures: RunFigures) -> None:
    assert figures.finish_reasons == {"stop": 5, "length": 1}
    assert list(figures.finish_reasons) == ["stop", "length"]
    assert figures.finish_rate("length") == pytest.approx(100 / 6)


def test_each_gpu_has_its_completions_tokens_and_accept_length(figures: RunFigures) -> None:
    gpus = {gpu.label: gpu for gpu in figures.gpus}
    assert (gpus["h1/gpu0"].completions, gpus["h1/gpu0"].output_tokens) == (3, 1550)
    assert (gpus["h1/gpu1"].completions, gpus["h1/gpu1"].output_tokens) == (2, 300)
    assert (gpus["h2/gpu0"].completions, gpus["h2/gpu0"].output_tokens) == (1, 500)
    assert gpus["h1/gpu0"].mean_spec_accept_length == pytest.approx(3.25)  # the unreported one left out
    assert gpus["h2/gpu0"].mean_spec_accept_length is None
    # h1/gpu0 finished 1550 tokens between 10 s and 75 s: 65 s
    assert gpus["h1/gpu0"].tokens_per_minute == pytest.approx(1550 / 65 * 60)


def test_the_run_spans_from_its_first_request_to_its_last_completion(figures: RunFigures) -> None:
    assert figures.started_at == T0
    assert figures.finished_at == T0 + 130
    assert figures.span_s == pytest.approx(130.0)
    assert figures.output_tokens_per_minute == pytest.approx(2350 / 130 * 60)


def test_throughput_buckets_hold_each_gpus_tokens_per_minute_by_finish_time(figures: RunFigures) -> None:
    series = {line.label: line for line in throughput_per_gpu(figures, bucket_s=60)}
    assert list(series["h1/gpu0"].bucket_start_s) == [0.0, 60.0, 120.0]
    assert list(series["h1/gpu0"].tokens_per_minute) == pytest.approx([150.0, 1400.0, 0.0])
    assert list(series["h1/gpu1"].tokens_per_minute) == pytest.approx([260.0, 0.0, 40.0])
    assert list(series["h2/gpu0"].tokens_per_minute) == pytest.approx([0.0, 500.0, 0.0])
    # Half-minute buckets hold half as many tokens, so twice that per minute in each
    halves = {line.label: line for line in throughput_per_gpu(figures, bucket_s=30)}
    assert list(halves["h2/gpu0"].tokens_per_minute) == pytest.approx([0.0, 0.0, 1000.0, 0.0, 0.0])


@pytest.mark.parametrize(("span_s", "bucket_s"), [(20, 1), (130, 2), (45 * 3600, 1800), (900 * 3600, 32400)])
def test_buckets_are_round_and_keep_a_line_to_about_a_hundred_points(span_s: float, bucket_s: int) -> None:
    assert bucket_width_s(span_s) == bucket_s


def test_a_conversation_counts_each_of_its_turns_with_its_own_label_and_lengths(tmp_path: Path) -> None:
    # Given a committed conversation of three turns (the second cut off in its answer) and one prompt
    turns = [
        completion("chat", host="h1", gpu=0, reasoning=100, answer=10, finished_after_s=10),
        completion(
            "chat",
            host="h1",
            gpu=0,
            reasoning=200,
            answer=20,
            finished_after_s=20,
            quality=Quality.TRUNCATED_IN_ANSWER,
            finish_reason="length",
        ),
    ]
    last = completion("chat", host="h1", gpu=0, reasoning=300, answer=30, finished_after_s=30)
    chat = msgspec.structs.replace(last, earlier_turns=[t.as_turn() for t in turns], conversation_turns=3)
    store = FolderStore(tmp_path / "output")
    commit(store, 0, [chat, completion("solo", host="h1", gpu=0, reasoning=5, answer=5, finished_after_s=5)])
    # When the report reads it
    figures = compute_figures(store, RUN)
    # Then every generated turn is a completion with its own label, finish reason and tokens
    assert (figures.rows, figures.completions) == (2, 4)
    assert figures.quality[Quality.TRUNCATED_IN_ANSWER.value] == 1
    assert figures.finish_reasons == {"stop": 3, "length": 1}
    assert figures.reasoning_tokens == 100 + 200 + 300 + 5
    assert summary_rows(figures)[0].value == "4 assistant turns of 2 conversations in 1 objects"


def test_only_the_small_columns_are_read_never_the_texts() -> None:
    assert {"messages", "reasoning_content", "content"}.isdisjoint(REPORT_COLUMNS)


class DeadHash:
    """Just enough of a Redis client for a run's `dead` hash."""

    def __init__(self, run: str, letters: dict[str, str]) -> None:
        self.key = RunKeys(run).dead
        self.letters = letters

    def hscan_iter(self, key: str, count: int) -> Iterator[tuple[bytes, bytes]]:
        assert key == self.key
        for prompt_id, reason in self.letters.items():
            letter = f'{{"prompt_id":"{prompt_id}","row":1,"reason":"{reason}","error":"x","attempts":3}}'
            yield prompt_id.encode(), letter.encode()


def test_dead_letters_are_counted_by_reason_from_the_runs_dead_hash() -> None:
    client = DeadHash(RUN, {"p1": "rejected_by_server", "p2": "max_attempts", "p3": "rejected_by_server"})
    assert dead_letters_by_reason(client, RUN) == {"rejected_by_server": 2, "max_attempts": 1}


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header.startswith(PNG_SIGNATURE), path
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def test_the_report_writes_every_picture_and_a_page_embedding_them(
    figures: RunFigures, tmp_path: Path
) -> None:
    page = write_report(figures, tmp_path / "report", generated_at=T0 + 200)
    expected_size = (round(FIGURE_SIZE_IN[0] * FIGURE_DPI), round(FIGURE_SIZE_IN[1] * FIGURE_DPI))
    for name in PICTURES.values():
        picture = tmp_path / "report" / name
        assert picture.stat().st_size > MIN_PICTURE_BYTES, name
        assert png_size(picture) == expected_size, name
    text = page.read_text()
    assert page.name == HTML_NAME
    assert text.count('src="data:image/png;base64,') == len(PICTURES)
    for shown in ("Run report-test", "h1/gpu0", "50.0% (3)", "rejected_by_server", "2,350"):
        assert shown in text, shown


def test_a_run_with_nothing_committed_still_gets_a_report(tmp_path: Path) -> None:
    empty = compute_figures(FolderStore(tmp_path / "nothing"), RUN)
    assert (empty.completions, empty.objects, empty.gpus) == (0, 0, [])
    page = write_report(empty, tmp_path / "report", generated_at=T0)
    assert "0 in 0 objects" in page.read_text()
    assert all((tmp_path / "report" / name).stat().st_size > 0 for name in PICTURES.values())


def test_the_report_command_reads_a_store_without_redis(
    store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "command-report"
    code = main(
        ["--redis-url", UNREACHABLE_REDIS, "report", "--run", RUN, "--output", store.url, "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "completions" in printed and "6 in 2 objects" in printed
    assert "dead letters" in printed and "unknown" in printed
    assert (out / HTML_NAME).stat().st_size > 0
    assert sorted(path.name for path in out.glob("*.png")) == sorted(PICTURES.values())


def test_the_report_command_without_a_store_needs_the_run_in_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--redis-url", UNREACHABLE_REDIS, "report", "--run", RUN, "--out", str(tmp_path / "r")])
    assert code == 2
    assert "pass --output URL" in capsys.readouterr().err


def test_the_loss_tokens_of_ok_rows_are_counted_from_usage_and_the_export_verdict_is_shown(
    figures: RunFigures,
) -> None:
    ok_rows = [row for row in PART_0 + PART_1 if row.quality is Quality.OK]
    assert figures.loss.rows == len(ok_rows)
    rows = {row.name: row.value for row in summary_rows(figures)}
    assert rows["ok rows under 32 loss tokens"].endswith("export passes")


def test_a_report_of_six_token_answers_says_the_export_would_refuse_them(tmp_path: Path) -> None:
    folder = FolderStore(tmp_path / "thinking-off")
    commit(
        folder,
        0,
        [completion(f"q{i}", host="h1", gpu=0, reasoning=0, answer=6, finished_after_s=i) for i in range(50)],
    )
    rows = {row.name: row.value for row in summary_rows(compute_figures(folder, RUN))}
    assert rows["ok rows under 32 loss tokens"] == "100.0% (50): export refuses"


@pytest.mark.parametrize("flag", ["--output", "--store"])
def test_report_reads_its_output_with_output_as_every_command_does_and_the_old_store_still_works(
    flag: str,
) -> None:
    args = build_parser().parse_args(["report", "--run", RUN, flag, "s3://bucket/runs/r"])
    assert args.output == "s3://bucket/runs/r"
