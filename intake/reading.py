"""The producer's input: DATA in, a stream of prompts and rejected rows out, with flat memory.

    for item in iter_prompts("s3://bucket/train.jsonl.zst"):
        if isinstance(item, RejectedRow): print(item.describe())
        else: enqueue(item)

Every row of the source yields exactly one item, in source order: a `Prompt` or a `RejectedRow`
(row number and reason). Only a source that cannot be read at all raises `SourceError`; a missing
file or object, an unknown file type or a Parquet file without a usable column raises at the call,
before any row is read. Close the generator to release the file or connection early. Duplicate
ids are passed through: counting them is the enqueuer's job.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

from core.records import Prompt, Turns
from intake.input_files import ColumnSelection, SourceRow, UnreadableRow, open_rows
from intake.input_stores import S3ClientFactory, default_s3_client
from intake.limits import DEFAULT_READ_LIMITS, ReadLimits
from intake.rejected import RejectedRow
from intake.row_fields import DEFAULT_ROW_FIELDS, RowFields
from intake.rows import parse_row


def prompt_columns(fields: RowFields) -> ColumnSelection:
    """The columns a prompt is read from, and those of which a file needs one."""
    return ColumnSelection(wanted=fields.wanted, need_one_of=fields.format_fields)


PROMPT_COLUMNS = prompt_columns(DEFAULT_ROW_FIELDS)


def iter_prompts(
    data: str,
    *,
    s3_client_factory: S3ClientFactory = default_s3_client,
    turns: Turns = Turns.LAST,
    limits: ReadLimits = DEFAULT_READ_LIMITS,
    fields: RowFields = DEFAULT_ROW_FIELDS,
) -> Generator[Prompt | RejectedRow, None, None]:
    """Open DATA now (raising SourceError if it is unusable) and stream its rows as prompts, built for
    the run's `turns` from the run's `fields` (intake/rows.py), none longer than `limits`
    (intake/limits.py)."""
    columns = prompt_columns(fields)
    rows = open_rows(data, columns=columns, s3_client_factory=s3_client_factory, limits=limits)
    return prompts_of(rows, turns=turns, fields=fields)


def prompts_of(
    rows: Iterator[SourceRow], *, turns: Turns = Turns.LAST, fields: RowFields = DEFAULT_ROW_FIELDS
) -> Generator[Prompt | RejectedRow, None, None]:
    """One prompt or rejection per source row."""
    for source_row in rows:
        if isinstance(source_row.value, UnreadableRow):
            yield RejectedRow(row=source_row.row, reason=source_row.value.reason, file=source_row.file)
        else:
            row, file = source_row.row, source_row.file
            yield parse_row(source_row.value, row=row, file=file, turns=turns, fields=fields)
