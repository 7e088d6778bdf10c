"""The settings a run pins at its first enqueue: what every request of it is sent with, how its data is
judged, and where its output goes; and the settings of a new run."""

from __future__ import annotations

import enum

import msgspec

from core.records import Record, SamplingSettings, Turns

DEFAULT_OUTPUT_ROOT = "./output"  # a new run stating no output gets <root>/<run>; DRAFTGEN_OUTPUT moves it
DEFAULT_BATCH_SIZE = 32  # prompts per message: small, so a batch lives far below the visibility timeout
DEFAULT_GATE_MIN_COMPLETIONS = 200
DEFAULT_GATE_MAX_EMPTY_ANSWER_RATE = 0.20
DEFAULT_GATE_MAX_TRUNCATED_RATE = 0.30
DEFAULT_RETRY_MAX_TOKENS_CAP = 131072


class TruncationPolicy(enum.StrEnum):
    """What to do with a completion whose thinking the budget cut off."""

    KEEP = "keep"  # commit it, labelled truncated_in_thinking
    DROP = "drop"  # dead-letter the prompt with the reason
    RETRY = "retry"  # ask again with double the budget, up to the cap; keep what the cap gives


class QualityGate(Record, frozen=True):
    """Pause the run when, over the completions since it last started or resumed, too many are bad."""

    min_completions: int = DEFAULT_GATE_MIN_COMPLETIONS
    max_empty_answer_rate: float = DEFAULT_GATE_MAX_EMPTY_ANSWER_RATE
    max_truncated_rate: float = DEFAULT_GATE_MAX_TRUNCATED_RATE  # in thinking and in answer together


class RunSettings(Record, frozen=True):
    run: str
    sampling: SamplingSettings
    output: str  # file:///abs/path or s3://bucket/prefix
    batch_size: int = DEFAULT_BATCH_SIZE
    gate: QualityGate = QualityGate()
    truncated_thinking: TruncationPolicy = TruncationPolicy.KEEP
    retry_max_tokens_cap: int = DEFAULT_RETRY_MAX_TOKENS_CAP
    # A new run regenerates every turn (NEW_RUN_TURNS); a run pinned before `turns` existed answered
    # the last turn only, and goes on doing so.
    turns: Turns = Turns.LAST
    # The dataset's own column names (intake/row_fields.py), None for the default layout: pinned, because
    # another mapping reads other ids or other text, and a re-run would enqueue every prompt again.
    prompt_field: str | None = None
    messages_field: str | None = None
    system_field: str | None = None
    id_field: str | None = None
    # How the dataset's turns name their role and their text, and its own role names (None: {role, content}
    # or ShareGPT {from, value}, with their usual role names): pinned for the same reason.
    turn_keys: tuple[str, str] | None = None
    roles: dict[str, str] | None = None
    # The input columns each completion keeps (KEEP_ALL_COLUMNS: all but the ones read as the prompt and
    # its id), and their types, pinned from the first rows of the first enqueue (core/kept_columns.py).
    keep_columns: tuple[str, ...] | None = None
    column_types: dict[str, str] | None = None


NEW_RUN_TURNS = Turns.ALL
KEEP_ALL_COLUMNS = "*"  # `--keep-columns '*'`: every column but the ones the prompt and its id are read from


def new_run_settings(run: str, output: str) -> RunSettings:
    """A new run's settings before anything is stated: every default, and every turn regenerated."""
    return RunSettings(run=run, sampling=SamplingSettings(), output=output, turns=NEW_RUN_TURNS)


def differences(pinned: RunSettings, given: RunSettings) -> list[str]:
    """Human-readable lines, one per field whose value differs."""
    pinned_fields = msgspec.to_builtins(pinned)
    given_fields = msgspec.to_builtins(given)
    lines: list[str] = []
    for name in pinned_fields:
        old, new = pinned_fields[name], given_fields.get(name)
        if isinstance(old, dict) and isinstance(new, dict):
            lines.extend(
                f"{name}.{sub}: pinned {old.get(sub)!r}, given {new.get(sub)!r}"
                for sub in sorted(set(old) | set(new))
                if old.get(sub) != new.get(sub)
            )
        elif old != new:
            lines.append(f"{name}: pinned {old!r}, given {new!r}")
    return lines
