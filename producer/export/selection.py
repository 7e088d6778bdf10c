"""Which committed rows an export hands to a trainer, and why each other row stays behind.

Defaults protect the user: only `ok` rows; rows whose text holds a literal `<think>`/`</think>`
are always dropped (SpecForge's regenerator skips them too: re-tokenized, they would open or close a
thinking block in the wrong place); rows without token ids cannot become `speculators` rows.
Rows longer than `max_length` are kept by default: both trainers cut a long sample to their
sequence length and still train on its first tokens, while dropping every long trace would bias
the drafter towards short reasoning. `--over-length drop` leaves them out instead.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from core.records import Completion, Quality
from producer.export.formats import ExportFormat, raw_think_markers, sequence_tokens

DEFAULT_INCLUDE = frozenset({Quality.OK})
SPECFORGE_MAX_LENGTH_TOKENS = 4096  # SpecForge's Qwen3.6-27B DFlash config
SPECULATORS_MAX_LENGTH_TOKENS = 8192  # vLLM speculators' default sequence length
DEFAULT_MAX_LENGTH_TOKENS: dict[ExportFormat, int | None] = {
    ExportFormat.SPECFORGE: SPECFORGE_MAX_LENGTH_TOKENS,
    ExportFormat.SPECULATORS: SPECULATORS_MAX_LENGTH_TOKENS,
    ExportFormat.SHAREGPT: None,
    ExportFormat.MESSAGES: None,
}


class OverLength(enum.StrEnum):
    KEEP = "keep"
    DROP = "drop"


class DropReason(enum.StrEnum):
    QUALITY = "quality"  # its label is not among --include
    THINK_MARKERS = "think_markers"
    NO_TOKEN_IDS = "no_token_ids"
    OVER_LENGTH = "over_length"


@dataclass(frozen=True)
class Selection:
    format: ExportFormat
    include: frozenset[Quality] = DEFAULT_INCLUDE
    max_length: int | None = None
    over_length: OverLength = OverLength.KEEP

    def drop_reason(self, completion: Completion) -> DropReason | None:
        if any(turn.quality not in self.include for turn in completion.turns()):
            return DropReason.QUALITY
        if raw_think_markers(completion):
            return DropReason.THINK_MARKERS
        if self.format is ExportFormat.SPECULATORS and any(
            t.response_token_ids is None for t in completion.turns()
        ):
            return DropReason.NO_TOKEN_IDS
        if self.over_length is OverLength.DROP and self.is_over_length(completion):
            return DropReason.OVER_LENGTH
        return None

    def is_over_length(self, completion: Completion) -> bool:
        return self.max_length is not None and sequence_tokens(completion) > self.max_length


@dataclass
class SelectionCounts:
    """What a pass over the output saw: kept rows, dropped ones by reason and quality, long ones."""

    committed: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # DropReason -> rows
    dropped_qualities: Counter[str] = field(default_factory=Counter)  # quality of rows dropped for it
    over_length: int = 0  # rows longer than max_length (kept or dropped)
    qualities: Counter[str] = field(default_factory=Counter)  # of every committed row
    finish_reasons: Counter[str] = field(default_factory=Counter)  # of every committed row
    without_ids: int = 0

    def count(self, selection: Selection, completion: Completion, reason: DropReason | None) -> None:
        self.committed += 1
        self.qualities[completion.quality.value] += 1
        self.finish_reasons[completion.finish_reason] += 1
        self.without_ids += completion.response_token_ids is None
        self.over_length += selection.is_over_length(completion)
        if reason is None:
            self.kept += 1
            return
        self.dropped[reason.value] += 1
        if reason is DropReason.QUALITY:
            self.dropped_qualities[completion.quality.value] += 1
