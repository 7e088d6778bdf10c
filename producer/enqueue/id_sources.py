"""Which files of a folder gave their rows' ids, and which left them to the hash: a file without the id
column among files with it gets hash ids silently, and a re-export of that file with its ids would
enqueue its rows again under other ids. `enqueue` warns of such files by name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from core.records import Prompt
from intake.prompt_ids import is_hashed_id
from intake.rejected import RejectedRow

FILES_NAMED_AT_MOST = 5


class IdSources:
    """Counts, per file of the input, the prompts whose id was the row's own and those hashed."""

    def __init__(self) -> None:
        self.own: Counter[str] = Counter()
        self.hashed: Counter[str] = Counter()

    def counted(self, items: Iterator[Prompt | RejectedRow]) -> Iterator[Prompt | RejectedRow]:
        for item in items:
            if isinstance(item, Prompt) and item.file:
                (self.hashed if is_hashed_id(item.id) else self.own)[item.file] += 1
            yield item

    def warning(self) -> str | None:
        """Files none of whose rows had an id, when other files' rows had theirs; None otherwise."""
        if not self.own:
            return None
        without = sorted(file for file in self.hashed if file not in self.own)
        if not without:
            return None
        named = ", ".join(f"{file} ({self.hashed[file]:,} rows)" for file in without[:FILES_NAMED_AT_MOST])
        more = (
            f" and {len(without) - FILES_NAMED_AT_MOST} more files"
            if len(without) > FILES_NAMED_AT_MOST
            else ""
        )
        return (
            f"{named}{more} gave no id column while the folder's other files did: their rows got ids "
            "hashed from their text, so the same rows given later with their ids would be enqueued again"
        )
