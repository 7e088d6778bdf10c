"""Committed objects round-trip whole, their columns are the record's fields (a field added to the record
reaches the Parquet), and reading one never makes the process abort at exit."""

from __future__ import annotations

import io
import subprocess
import sys

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.records import Completion, Message, Quality, SamplingSettings, Timings, Turn, Usage
from devstack.local_stack import PROJECT_ROOT
from tests.support.records import completion
from workers.record.arrow_schema import NoArrowType, arrow_schema
from workers.record.parquet_io import (
    COMPLETION_SCHEMA,
    KEPT_COLUMNS_FIELD,
    completions_to_parquet,
    prompt_ids_in,
    read_completions,
    records_to_parquet,
)

EXIT_RUNS = 3
READ_AND_EXIT = """
from tests.support.records import completion
from workers.record.parquet_io import completions_to_parquet, prompt_ids_in
print(len(prompt_ids_in(completions_to_parquet([completion(f"p{i}") for i in range(500)]))))
"""


def test_completions_come_back_as_they_were_written() -> None:
    written = [completion("a", content="\n\nforty-two"), completion("b", size=3)]
    assert read_completions(completions_to_parquet(written)) == written
    assert prompt_ids_in(completions_to_parquet(written)) == ["a", "b"]


def every_field_set(prompt_id: str) -> Completion:
    """A completion none of whose fields, nor its turns' fields, is at its default: a column the output
    lacked would come back as the default and fail the comparison."""
    turn = Turn(
        reasoning_content="\nfirst thought",
        content="\n\nfirst answer",
        finish_reason="length",
        quality=Quality.TRUNCATED_IN_ANSWER,
        usage=Usage(prompt_tokens=11, completion_tokens=12, reasoning_tokens=13),
        timings=Timings(started_at=1.5, finished_at=2.5, latency_s=1.0),
        max_tokens=4096,
        attempt=2,
        budget_retries=1,
        spec_accept_length=3.25,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5, 2**31 - 1],
    )
    base = completion(prompt_id, content="\n\nsecond answer", size=2)
    return msgspec.structs.replace(
        base,
        messages=[Message(role="system", content="be brief"), Message(role="user", content="q")],
        sampling=SamplingSettings(model="m", temperature=0.7, top_p=0.8, top_k=5, min_p=0.1, seed=9),
        origin=msgspec.structs.replace(base.origin, server="abc123", gpu=None),
        spec_accept_length=2.75,
        budget_retries=2,
        prompt_token_ids=[6, 7],
        response_token_ids=[8],
        earlier_turns=[turn],
        conversation_turns=3,
    )


def test_a_completion_comes_back_with_every_field_as_written_not_defaulted() -> None:
    written = [every_field_set("a"), completion("b")]
    assert read_completions(completions_to_parquet(written)) == written


class WiderCompletion(Completion, frozen=True):
    """The completion record as it would be with one more field."""

    judge_score: float | None = None


def test_a_field_added_to_the_record_reaches_the_parquet_without_touching_the_writer() -> None:
    wider = WiderCompletion(**msgspec.structs.asdict(completion("a")), judge_score=0.5)
    schema = arrow_schema(WiderCompletion, leave_out=(KEPT_COLUMNS_FIELD,))
    table = pq.read_table(io.BytesIO(records_to_parquet([wider], schema)))
    assert table.schema.names == [*COMPLETION_SCHEMA.names, "judge_score"]
    assert table.column("judge_score").to_pylist() == [0.5]


def test_token_ids_are_32_bit_columns_and_the_rest_as_the_record_declares() -> None:
    assert COMPLETION_SCHEMA.field("response_token_ids").type == pa.list_(pa.int32())
    assert COMPLETION_SCHEMA.field("quality").type == pa.string()
    assert COMPLETION_SCHEMA.field("usage").type.field("completion_tokens").type == pa.int64()
    turn = COMPLETION_SCHEMA.field("earlier_turns").type.value_type
    assert [turn.field(i).name for i in range(turn.num_fields)] == list(Turn.__struct_fields__)


def test_a_part_written_with_its_columns_in_another_order_reads_the_same() -> None:
    # a reader goes by name: a field moved in the record, or a part another writer made, reads the same
    columns = [f for f in COMPLETION_SCHEMA if f.name != "quality"]
    older = pa.schema([*columns[:10], COMPLETION_SCHEMA.field("quality"), *columns[10:]])
    written = [every_field_set("a")]
    assert read_completions(records_to_parquet(written, older)) == written


class Unwritable(msgspec.Struct):
    extras: dict[str, str]


def test_a_record_field_with_no_column_type_is_refused_where_the_schema_is_made() -> None:
    with pytest.raises(NoArrowType, match="DictType"):
        arrow_schema(Unwritable)


def test_a_process_that_read_an_object_exits_cleanly() -> None:
    # pyarrow 26 aborted at exit after a threaded read, which made `verify` fail at random
    for _ in range(EXIT_RUNS):
        result = subprocess.run(
            [sys.executable, "-c", READ_AND_EXIT],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert (result.returncode, result.stdout.strip()) == (0, "500"), result.stderr
