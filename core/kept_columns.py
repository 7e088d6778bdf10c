"""The input columns a run keeps beside each completion (`--keep-columns`): their types, and each row's
values checked against them.

A column's type is pinned with the run, from its first rows (the first non-null value of each column
among them): every Parquet part of the run then has the same `columns` struct, so pandas, pyarrow and
`datasets` read all parts as one table. Values are kept as JSON types them: a string, an integer, a
float, a boolean; a list or an object is kept whole as JSON text (type `json`), and so is a column
whose first rows disagree or hold no value. A Parquet input's dates and timestamps arrive as ISO-8601
strings, bytes as base64. A later row whose value is of another type is rejected, naming the column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

KIND_STRING = "string"
KIND_INTEGER = "integer"
KIND_FLOAT = "float"
KIND_BOOLEAN = "boolean"
KIND_JSON = "json"  # anything, kept as its JSON text
COLUMN_KINDS = (KIND_STRING, KIND_INTEGER, KIND_FLOAT, KIND_BOOLEAN, KIND_JSON)
NUMBER_KINDS = frozenset({KIND_INTEGER, KIND_FLOAT})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # an integer column is int64; a larger integer is kept as JSON


class ColumnValueRefused(ValueError):
    """A kept column's value does not fit the type the run pinned for it (the row is rejected)."""


def kind_of(value: Any) -> str | None:
    """The kind of a JSON value (an integer past 64 bits is JSON); None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return KIND_BOOLEAN
    if isinstance(value, int):
        return KIND_INTEGER if INT64_MIN <= value <= INT64_MAX else KIND_JSON
    if isinstance(value, float):
        return KIND_FLOAT
    if isinstance(value, str):
        return KIND_STRING
    return KIND_JSON


def _joined(first: str, second: str) -> str:
    """The kind that holds values of both: a float holds integers; anything else disagreeing is JSON."""
    if first == second:
        return first
    return KIND_FLOAT if {first, second} == NUMBER_KINDS else KIND_JSON


def pinned_types(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Each column's kind over the first rows, in the order the columns first appear."""
    kinds: dict[str, str | None] = {}
    for columns in rows:
        for name, value in columns.items():
            kind, known = kind_of(value), kinds.get(name)
            kinds[name] = kind if known is None else (known if kind is None else _joined(known, kind))
    return {name: kind or KIND_JSON for name, kind in kinds.items()}


def fitted_columns(columns: Mapping[str, Any], types: Mapping[str, str]) -> dict[str, Any]:
    """A row's kept values in the run's types (a JSON column's as JSON text, an integer in a float
    column as a float, an absent column null); ColumnValueRefused naming the first that does not fit.
    Columns the run does not keep are left out (`unkept_columns` names them)."""
    fitted: dict[str, Any] = {}
    for name, kind in types.items():
        value: Any = columns.get(name)
        found = kind_of(value)
        if found is None:
            fitted[name] = None
        elif kind == KIND_JSON:
            fitted[name] = msgspec.json.encode(value).decode()
        elif found == kind:
            fitted[name] = value
        elif kind == KIND_FLOAT and found == KIND_INTEGER:
            fitted[name] = float(value)
        else:
            raise ColumnValueRefused(
                f"column {name!r}: {_shown(value)} is {_article(found)}; the run keeps {name!r} as "
                f"{_article(kind)} (its type in the first rows)"
            )
    return fitted


def columns_problem(columns: Mapping[str, Any], types: Mapping[str, str] | None) -> str | None:
    """Why a record's kept columns, read back, are not what the run's types let enqueue write (a column
    they do not name, a value of another kind), or None: Parquet could not write such a value."""
    for name, value in columns.items():
        kind = (types or {}).get(name)
        if kind is None:
            return f"holds column {name!r}, which the run does not keep"
        found = kind_of(value)
        if found is not None and found != (KIND_STRING if kind == KIND_JSON else kind):
            held = "a list or an object" if found == KIND_JSON else _article(found)
            return f"column {name!r} holds {held}, the run keeps it as {_described(kind)}"
    return None


def unkept_columns(columns: Mapping[str, Any], types: Mapping[str, str]) -> list[str]:
    """The row's columns the run's pinned types do not name (with `*`, ones its first rows lacked)."""
    return [name for name in columns if name not in types]


def input_values(columns: Mapping[str, Any], types: Mapping[str, str]) -> dict[str, Any]:
    """Kept values as the input gave them: each JSON column's text decoded (for an export's rows)."""
    return {
        name: msgspec.json.decode(value) if types.get(name) == KIND_JSON and isinstance(value, str) else value
        for name, value in columns.items()
    }


def _described(kind: str) -> str:
    """A kind as the record holds it: a JSON column holds the value's JSON text."""
    return "JSON text" if kind == KIND_JSON else _article(kind)


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


SHOWN_VALUE_CHARS = 40


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS] + "…"
