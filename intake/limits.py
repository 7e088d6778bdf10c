"""How much of the input one row may take, enforced while reading: no file, however made, costs gigabytes.

A row's size is its bytes as read: a JSONL line after decompression, or the bytes of a Parquet or Arrow
row's cells. The default limit is derived from the run: a prompt must leave room for the run's max_tokens
in the longest context any served model has, and no token is more than `MAX_ROW_BYTES_PER_TOKEN` bytes of
row (JSON escapes included), so a longer row can never be sent; `--max-row-bytes` raises it.

A row over the limit is rejected by row number with its size, and reading goes on with the next one. A
JSONL line that runs on past `OVERLONG_LINE_SKIP_FACTOR` limits without a line end is no row at all (a
decompression bomb, a binary file named .jsonl): the file is refused there, never inflated to its end. So
is a file whose rows hold over `MAX_EXPANSION_RATIO` times the bytes it stores: a bomb of short lines.

Structure is bounded too: a row nested deeper than the JSON decoder recurses (Python's recursion limit)
is rejected with that reason, and the fields a prompt is read from have a fixed shape (intake/rows.py),
at most `MAX_TURNS` messages of at most `MAX_CONTENT_PARTS` parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from intake.errors import SourceError

LONGEST_CONTEXT_TOKENS = 1_048_576  # the longest context an SGLang-served model offers (1M tokens)
MAX_ROW_BYTES_PER_TOKEN = 8  # UTF-8 of a CJK or emoji token, or JSON's \uXXXX escapes, stay below this
MIN_MAX_ROW_BYTES = 1024 * 1024  # whatever max_tokens, a 1 MiB row is never refused by default
OVERLONG_LINE_SKIP_FACTOR = 16  # an over-long line is skipped to its end only this many limits far
MAX_EXPANSION_RATIO = 1000  # text compresses 3-20x; past this a file is made to inflate (gzip stops at 1032)
EXPANSION_CHECKED_FROM_BYTES = 256 * 1024 * 1024  # smaller files are never refused for their ratio
BATCH_BYTES = 64 * 1024 * 1024  # Parquet/Arrow rows turned into Python objects at a time, at most
MAX_TURNS = 4096  # messages of one row
MAX_CONTENT_PARTS = 4096  # parts of one message's content


def row_limit_bytes(max_tokens: int) -> int:
    """The longest row a run with this max_tokens could ever send, in bytes."""
    room_tokens = LONGEST_CONTEXT_TOKENS - max_tokens
    return max(MIN_MAX_ROW_BYTES, room_tokens * MAX_ROW_BYTES_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """The bounds a reader keeps, built where the run's settings are known and passed down."""

    max_row_bytes: int = row_limit_bytes(0)
    batch_bytes: int = BATCH_BYTES

    @property
    def overlong_line_skip_bytes(self) -> int:
        return self.max_row_bytes * OVERLONG_LINE_SKIP_FACTOR

    def check_expansion(self, read_bytes: int, stored_bytes: Callable[[], int]) -> None:
        """Refuse (SourceError) a file whose rows hold far more than a compressed text file can. A plain
        file never is: its rows are its stored bytes. `stored_bytes` is asked only past the floor."""
        if read_bytes <= EXPANSION_CHECKED_FROM_BYTES:
            return
        stored = stored_bytes()
        if read_bytes > MAX_EXPANSION_RATIO * stored:
            raise SourceError(
                f"{stored:,} bytes stored expand to more than {read_bytes:,}, over "
                f"{MAX_EXPANSION_RATIO} times: no text compresses so well (a decompression bomb?): refused"
            )

    def over_limit(self, size_bytes: int) -> str:
        """The rejection reason of a row of this size."""
        return (
            f"row is {size_bytes:,} bytes, over the limit of {self.max_row_bytes:,} "
            "(no context holds it; --max-row-bytes raises the limit)"
        )


DEFAULT_READ_LIMITS = ReadLimits()
