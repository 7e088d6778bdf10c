"""Which content an explicit id was enqueued with, and by which enqueue: how a conflict is told from a
duplicate, and named.

Redis keeps them for `enqueue` (as the holders of explicit ids in the run's id buckets, RunKeys.ids,
and its `enqueues` list of notes); the output keeps them too, in the object of each chunk's ids
(`enqueued/<key>.json`), so that `recover` rebuilds them after Redis is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.records import Prompt, row_place
from intake.prompt_ids import HASHED_ID_PREFIX, hashed_id

FINGERPRINT_HEX_CHARS = 16  # 64 bits of the content's sha256: tells two versions of a row apart
FINGERPRINT_SEPARATOR = "|"


@dataclass(frozen=True)
class Fingerprint:
    """Which content an id was enqueued with, and where: kept for explicit ids only."""

    digest: str
    enqueue_number: int  # 1 for the run's first enqueue
    row: int
    file: str = ""  # in a folder or S3 prefix: which file; empty for a one-file source (and costs nothing)

    def encode(self) -> str:
        fields = [self.digest, str(self.enqueue_number), str(self.row)]
        return FINGERPRINT_SEPARATOR.join([*fields, self.file] if self.file else fields)

    @classmethod
    def decode(cls, raw: bytes | None) -> Fingerprint | None:
        parts = raw.decode().split(FINGERPRINT_SEPARATOR, 3) if raw is not None else []  # a file may hold |
        if len(parts) not in (3, 4) or not parts[1].isdigit() or not parts[2].isdigit():
            return None  # absent, or not ours: no conflict can be told
        file = parts[3] if len(parts) == 4 else ""
        return cls(digest=parts[0], enqueue_number=int(parts[1]), row=int(parts[2]), file=file)

    def place(self) -> str:
        return row_place(self.row, self.file)


def content_digest(prompt: Prompt) -> str | None:
    """A short digest of the prompt's messages; None for a hashed id, which is its content's digest."""
    full = hashed_id(prompt.messages)
    if prompt.id == full:
        return None
    return full.removeprefix(HASHED_ID_PREFIX)[:FINGERPRINT_HEX_CHARS]
