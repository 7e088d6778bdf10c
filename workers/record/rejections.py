"""The output's record of rejected input rows: where each row is and why it cannot become a prompt, and the
input it came from (the objects `rejected/<key>.jsonl` that `enqueue` writes and `rejects` reads).
"""

from __future__ import annotations

from core.records import Record
from intake.rejected import RejectedRow


class StoredRejection(Record, frozen=True):
    """A rejected row as the object store keeps it: which input it came from, and where and why."""

    source: str
    rejected: RejectedRow
