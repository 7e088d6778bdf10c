"""A row of the input that cannot become a prompt: where it is and why."""

from __future__ import annotations

from core.records import Record, row_place


class RejectedRow(Record, frozen=True, kw_only=True):
    """A row that cannot become a prompt, with where it is and why.

    `row` is the physical line number in a JSONL file (blank lines are skipped but still counted,
    so an editor opens the file at the right line) or the 1-based row index in a Parquet or Arrow
    file. `file` names the file inside a folder or S3 prefix; it is empty for a one-file source.
    """

    row: int
    reason: str
    file: str = ""

    def describe(self) -> str:
        return f"{row_place(self.row, self.file)}: {self.reason}"
