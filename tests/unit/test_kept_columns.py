"""A run's kept input columns: typed from its first rows, checked on every row, one struct in every part."""

from __future__ import annotations

import datetime
import io

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.kept_columns import (
    ColumnValueRefused,
    columns_problem,
    fitted_columns,
    input_values,
    pinned_types,
)
from core.records import Message, Prompt, SamplingSettings, Turns
from core.run_settings.model import RunSettings
from intake.rejected import RejectedRow
from intake.row_fields import RowFields
from intake.rows import parse_row
from producer.enqueue.kept_columns import with_kept_columns
from tests.support.records import completion
from workers.record.parquet_io import completions_to_parquet, read_completions

TYPES = {"lang": "string", "score": "float", "n": "integer", "ok": "boolean", "tags": "json"}


def test_each_column_takes_the_type_of_its_first_value_and_disagreeing_ones_widen() -> None:
    first_rows: list[dict[str, object]] = [
        {"lang": "en", "score": 1, "n": None, "tags": ["a"]},
        {"lang": "fr", "score": 0.5, "n": 3, "tags": None, "odd": 1},
        {"odd": "x", "empty": None},
    ]
    assert pinned_types(first_rows) == {
        "lang": "string",
        "score": "float",  # an integer then a float: a float holds both
        "n": "integer",  # null first, then an integer
        "tags": "json",  # a list is kept whole as JSON
        "odd": "json",  # an integer then a string: only JSON holds both
        "empty": "json",  # never a value in the first rows: JSON holds whatever comes
    }


def test_an_integer_past_64_bits_is_kept_as_json_not_refused_by_parquet() -> None:
    assert pinned_types([{"big": 2**70}]) == {"big": "json"}


def test_a_row_fits_the_types_absent_columns_null_integers_in_a_float_column_as_floats() -> None:
    fitted = fitted_columns({"lang": "en", "score": 2, "tags": ["a", {"b": 1}], "other": 1}, TYPES)
    assert fitted == {"lang": "en", "score": 2.0, "n": None, "ok": None, "tags": '["a",{"b":1}]'}
    assert input_values(fitted, TYPES)["tags"] == ["a", {"b": 1}]


def test_a_value_of_another_type_refuses_the_row_naming_the_column_and_both_types() -> None:
    with pytest.raises(
        ColumnValueRefused, match="column 'n': '3' is a string; the run keeps 'n' as an integer"
    ):
        fitted_columns({"n": "3"}, TYPES)


def test_every_part_of_a_run_has_the_same_struct_whatever_its_rows_hold() -> None:
    full = msgspec.structs.replace(
        completion("a"), columns=fitted_columns({"lang": "en", "n": 4, "ok": True}, TYPES)
    )
    sparse = msgspec.structs.replace(completion("b"), columns=fitted_columns({}, TYPES))
    parts = [completions_to_parquet([full], TYPES), completions_to_parquet([sparse], TYPES)]
    schemas = [pq.read_schema(io.BytesIO(part)) for part in parts]
    assert schemas[0] == schemas[1]
    assert schemas[0].field("columns").type == pa.struct(
        [
            ("lang", pa.string()),
            ("score", pa.float64()),
            ("n", pa.int64()),
            ("ok", pa.bool_()),
            ("tags", pa.string()),
        ]
    )
    assert read_completions(parts[0]) == [full]
    assert read_completions(parts[1])[0].columns == dict.fromkeys(TYPES)


def test_a_run_that_keeps_no_column_has_no_columns_column() -> None:
    part = completions_to_parquet([completion("a")])
    assert "columns" not in pq.read_schema(io.BytesIO(part)).names
    assert read_completions(part)[0].columns == {}


def test_kept_columns_read_back_that_the_run_does_not_keep_or_of_another_type_are_named() -> None:
    wrong_type = "column 'lang' holds an integer, the run keeps it as a string"
    not_text = "column 'tags' holds a list or an object, the run keeps it as JSON text"
    assert columns_problem({"lang": "en", "tags": "[1]"}, TYPES) is None
    assert columns_problem({"lang": 3}, TYPES) == wrong_type
    assert columns_problem({"tags": [1]}, TYPES) == not_text
    assert columns_problem({"x": 1}, TYPES) == "holds column 'x', which the run does not keep"
    assert columns_problem({"x": 1}, None) == "holds column 'x', which the run does not keep"


def test_star_keeps_every_column_but_the_ones_the_prompt_and_its_id_are_read_from() -> None:
    fields = RowFields.mapped(prompt="question", id_field="uid", keep=("*",))
    row = {
        "uid": 7,
        "question": "why?",
        "system": "be brief",
        "lang": "en",
        "when": datetime.date(2026, 1, 2),
    }
    prompt = parse_row(row, row=1, turns=Turns.LAST, fields=fields)
    assert not isinstance(prompt, RejectedRow)
    assert prompt.columns == {"lang": "en", "when": "2026-01-02"}  # a date as its ISO-8601 text


def test_named_columns_are_kept_and_a_missing_one_is_left_to_be_null() -> None:
    fields = RowFields.mapped(keep=("lang", "source"))
    prompt = parse_row({"prompt": "hi", "lang": "en", "extra": 1}, row=1, fields=fields)
    assert not isinstance(prompt, RejectedRow)
    assert prompt.columns == {"lang": "en"}
    assert fields.wanted is not None and {"lang", "source"} <= set(fields.wanted)
    assert RowFields.mapped(keep=("*",)).wanted is None  # a Parquet file's every column is read


def prompt_with(number: int, **columns: object) -> Prompt:
    return Prompt(id=f"p{number}", messages=[Message(role="user", content="hi")], row=number, columns=columns)


def test_enqueue_counts_the_columns_a_run_keeping_all_could_not_keep_and_says_which() -> None:
    settings = RunSettings(run="r", sampling=SamplingSettings(), output="file:///o", keep_columns=("*",))
    first = [prompt_with(1, lang="en"), prompt_with(2, lang="de", late=1)]
    items, pinned, kept = with_kept_columns(iter(first), settings)
    assert [item.columns for item in items if isinstance(item, Prompt)] == [
        {"lang": "en", "late": None},
        {"lang": "de", "late": 1},
    ]
    assert pinned.column_types == {"lang": "string", "late": "integer"}  # both rows were among the first
    assert kept is not None and kept.unkept_warning() is None

    later = msgspec.structs.replace(pinned, column_types={"lang": "string"})
    items, _, kept = with_kept_columns(
        iter([prompt_with(3, lang="fr", late=2), prompt_with(4, late=3)]), later
    )
    assert [item.columns for item in items if isinstance(item, Prompt)] == [{"lang": "fr"}, {"lang": None}]
    assert kept is not None and kept.unkept_warning() == (
        "columns not kept: 'late' (2 rows): the run's first rows lacked them, so its output has no place for "
        "them (its kept columns: lang)"
    )
