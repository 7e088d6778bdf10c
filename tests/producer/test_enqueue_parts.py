"""Dealing one enqueue's rows to processes: how many, which part each row goes to, one report of all."""

from __future__ import annotations

import io
from collections.abc import Iterator

import msgspec
import pytest

from core.exit_codes import EXIT_USAGE
from core.records import Message, Prompt
from intake.rejected import RejectedRow
from producer.cli import main
from producer.enqueue.enqueuer import MAX_REJECTIONS_SHOWN, EnqueueReport
from producer.enqueue.processes import (
    PartChunk,
    PartFailed,
    PartOutcome,
    merged,
    part_of,
    parts_for,
    raised_in_part,
    received_chunks,
    write_frame,
)
from producer.errors import EnqueueBusy
from producer.settings import MAX_ENQUEUE_PROCESSES, PROCESSES_MIN_ROWS, default_enqueue_processes


def prompts(count: int) -> Iterator[Prompt | RejectedRow]:
    return (
        Prompt(id=f"p{i}", messages=[Message(role="user", content="hi")], row=i + 1) for i in range(count)
    )


def test_a_small_input_is_enqueued_in_one_process_and_loses_no_row_to_the_look_ahead() -> None:
    items, parts = parts_for(prompts(PROCESSES_MIN_ROWS), None)
    assert parts == 1
    assert len(list(items)) == PROCESSES_MIN_ROWS


def test_a_large_input_is_enqueued_in_one_process_per_core_with_every_row_in_order() -> None:
    items, parts = parts_for(prompts(PROCESSES_MIN_ROWS + 5), None)
    assert parts == default_enqueue_processes()
    assert [item.row for item in items] == list(range(1, PROCESSES_MIN_ROWS + 6))


def test_processes_asked_for_are_used_without_reading_ahead() -> None:
    source = prompts(10)
    items, parts = parts_for(source, 3)
    assert parts == 3
    assert items is source


def test_every_row_of_an_id_goes_to_the_same_part_and_the_parts_share_the_ids() -> None:
    parts = 4
    chosen = [part_of(Prompt(id=f"id-{i}", messages=[], row=i), parts) for i in range(2000)]
    again = [part_of(Prompt(id=f"id-{i}", messages=[], row=9999), parts) for i in range(2000)]
    assert chosen == again
    assert sorted(set(chosen)) == [0, 1, 2, 3]
    assert min(chosen.count(part) for part in range(parts)) > 2000 / parts / 2


def test_the_merged_report_adds_the_counts_and_shows_the_inputs_first_rejections_in_order() -> None:
    def rejected(rows: range) -> list[RejectedRow]:
        return [RejectedRow(row=row, reason="no prompt") for row in rows]

    first = EnqueueReport(
        new=5, rejected=rejected(range(2, 2 * MAX_REJECTIONS_SHOWN + 2, 2)), rejected_count=30
    )
    second = EnqueueReport(
        new=7, batches=2, rejected=rejected(range(1, 2 * MAX_REJECTIONS_SHOWN + 1, 2)), rejected_count=25
    )
    report = merged([first, second])
    assert (report.new, report.batches, report.rejected_count) == (12, 2, 55)
    assert [row.row for row in report.rejected] == list(range(1, MAX_REJECTIONS_SHOWN + 1))


def test_a_part_whose_reading_process_is_gone_takes_what_came_and_stops_without_a_traceback() -> None:
    stream = io.BytesIO()
    write_frame(stream, msgspec.msgpack.encode(PartChunk(prompts=list(prompts(2)), rejected=[])))  # type: ignore[arg-type]
    stream.seek(0)  # and then nothing: no end-of-input frame
    assert [[item.row for item in chunk] for chunk in received_chunks(stream)] == [[1, 2]]


def test_an_error_a_part_reports_is_raised_as_the_class_of_the_producers_tree_it_named() -> None:
    busy = raised_in_part(PartOutcome(error_type="EnqueueBusy", error="lost its lease"))
    assert (type(busy), str(busy)) == (EnqueueBusy, "lost its lease")
    assert type(raised_in_part(PartOutcome(error_type="NotAnError", error="?"))) is PartFailed


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("0", "0 must be above 0"),
        (str(MAX_ENQUEUE_PROCESSES + 1), f"{MAX_ENQUEUE_PROCESSES + 1} is more than {MAX_ENQUEUE_PROCESSES}"),
    ],
)
def test_processes_out_of_range_are_refused_before_anything_is_touched(
    given: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "--redis-url",
                "redis://127.0.0.1:1/0",
                "enqueue",
                "missing.jsonl",
                "--run",
                "r",
                "--processes",
                given,
            ]
        )
    assert stopped.value.code == EXIT_USAGE
    assert f"argument --processes: {said}" in capsys.readouterr().err
