"""The columns a run keeps, at enqueue: their types pinned from a new run's first rows, and every row's
values checked against them before it is enqueued (core/kept_columns.py says how)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import msgspec

from core.kept_columns import KIND_JSON, ColumnValueRefused, fitted_columns, pinned_types, unkept_columns
from core.records import Prompt
from core.run_settings.keys import column_types_problem
from core.run_settings.model import KEEP_ALL_COLUMNS, RunSettings
from intake.rejected import RejectedRow
from producer.errors import SettingsError

COLUMN_TYPE_ROWS = 1_000  # a new run's first prompts its kept columns' types are read from


class KeptColumns:
    """Checks each prompt's kept columns against the run's types; counts the columns it could not keep."""

    def __init__(self, types: dict[str, str]) -> None:
        self.types = types
        self.unkept: Counter[str] = Counter()  # a column the types lack -> rows that had it

    def checked(self, items: Iterator[Prompt | RejectedRow]) -> Iterator[Prompt | RejectedRow]:
        for item in items:
            yield item if isinstance(item, RejectedRow) else self._fitted(item)

    def _fitted(self, prompt: Prompt) -> Prompt | RejectedRow:
        try:
            columns = fitted_columns(prompt.columns, self.types)
        except ColumnValueRefused as refusal:
            return RejectedRow(row=prompt.row, reason=str(refusal), file=prompt.file)
        self.unkept.update(unkept_columns(prompt.columns, self.types))
        return msgspec.structs.replace(prompt, columns=columns)

    def unkept_warning(self) -> str | None:
        if not self.unkept:
            return None
        named = ", ".join(f"{name!r} ({rows:,} rows)" for name, rows in self.unkept.most_common())
        return (
            f"columns not kept: {named}: the run's first rows lacked them, so its output has no place for "
            f"them (its kept columns: {', '.join(self.types)})"
        )


def with_kept_columns(
    items: Iterator[Prompt | RejectedRow], settings: RunSettings
) -> tuple[Iterator[Prompt | RejectedRow], RunSettings, KeptColumns | None]:
    """The stream with each prompt's kept columns in the run's types, and the settings with those types
    (a new run's read from its first COLUMN_TYPE_ROWS prompts; SettingsError, before anything is pinned,
    when `*` finds a column no output can hold); no change for a run that keeps none."""
    if not settings.keep_columns:
        return items, settings, None
    if settings.column_types is None:
        first = list(itertools.islice(items, COLUMN_TYPE_ROWS))
        types = pinned_types(item.columns for item in first if isinstance(item, Prompt))
        if settings.keep_columns != (KEEP_ALL_COLUMNS,):
            types = {name: types.get(name, KIND_JSON) for name in settings.keep_columns}
        if (problem := column_types_problem(types)) is not None:
            raise SettingsError(
                f"--keep-columns {','.join(settings.keep_columns)}: {problem}; name the columns to keep"
            )
        settings = msgspec.structs.replace(settings, column_types=types)
        items = itertools.chain(first, items)
    kept = KeptColumns(dict(settings.column_types or {}))
    return kept.checked(items), settings, kept
