"""The output's record of rejected input rows: where each row is and why it cannot become a prompt, and the
input it came from (the objects `rejected/<key>.jsonl` that `enqueue` writes and `rejects` reads).
"""

from __future__ import annotations

from inference.records import Record, row_place


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


class StoredRejection(Record, frozen=True):
    """A rejected row as the object store keeps it: which input it came from, and where and why."""

    source: str
    rejected: RejectedRow
