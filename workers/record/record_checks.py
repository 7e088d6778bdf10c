"""Holding each record of the upload path against its field and the run before it is committed.

A GPU node's Redis user may write the hand-over keys directly and call the hand-over functions with any
id and any blob, so the uploader trusts nothing it reads there. A staged completion is committed only
when it inflates within the record limit to a Completion, names the prompt its field names, that prompt
is one the run accepted (in its id buckets), and is neither committed nor dead-lettered already; a
pending dead letter likewise (a dead letter of a committed prompt is not committed). Anything else is
quarantined (workers/state/quarantine.py) with the first reason that applies, in that order.

`check_staged_record` judges one staged record against a run in Redis: the schedule explorer uses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis

from core.kept_columns import columns_problem
from core.records import Completion, DeadLetter
from workers.errors import RecordUnreadable
from workers.state.codec import OVER_LIMIT, decode_json, inflate
from workers.state.keys import RunKeys
from workers.state.quarantine import (
    QuarantinedRecord,
    QuarantineKind,
    QuarantineReason,
    quarantined,
    unreadable,
)
from workers.state.record_limits import PREVIEW_BYTES, RECORD_LIMIT_BYTES, SMALL_RECORD_LIMIT_BYTES

R = TypeVar("R", Completion, DeadLetter)


@dataclass(frozen=True)
class RunView:
    """What the run holds of one id."""

    accepted: bool  # in the run's id buckets
    done: bool  # committed
    dead: bool  # dead-lettered (committed or pending)
    staged: bool | None  # a completion awaits upload (None: not asked)

    @property
    def unsettled(self) -> bool:
        """One of the run's prompts that still needs generating."""
        return self.accepted and not (self.done or self.dead or self.staged)


@dataclass(frozen=True)
class Checked(Generic[R]):
    """A record of the upload path, judged: the record to commit, or its quarantine entry."""

    field: str
    record: R | None
    quarantined: QuarantinedRecord | None
    real_prompt: bool  # the field is an id the run accepted (a quarantined one is generated again)
    inflated_bytes: int = 0  # what judging it inflated (a part's budget counts it)
    raw_field: bytes | None = None  # a field that is no text, as Redis holds it

    @property
    def redis_field(self) -> bytes | str:
        """The field as Redis knows it."""
        return self.raw_field if self.raw_field is not None else self.field


def read_views(
    client: redis.Redis, keys: RunKeys, ids: Sequence[str], *, staged: bool = True
) -> list[RunView]:
    """What the run holds of each id, in one round trip (whether it is staged only when asked: a record
    read from `staged` is)."""
    if not ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        for prompt_id in ids:
            pipe.hexists(keys.ids(prompt_id), prompt_id)
        pipe.smismember(keys.done, list(ids))
        for prompt_id in ids:
            pipe.hexists(keys.dead, prompt_id)
        for prompt_id in ids if staged else ():
            pipe.hexists(keys.staged, prompt_id)
        replies = pipe.execute()
    count = len(ids)
    accepted, done = replies[:count], replies[count]
    dead, is_staged = replies[count + 1 : 2 * count + 1], replies[2 * count + 1 :] or [None] * count
    return [
        RunView(accepted=bool(a), done=bool(d), dead=bool(x), staged=None if s is None else bool(s))
        for a, d, x, s in zip(accepted, done, dead, is_staged, strict=True)
    ]


def named(members: Sequence[bytes], kind: QuarantineKind) -> tuple[list[str], list[Checked[Any]]]:
    """The ids of an index's members; a member that is not UTF-8 text is no prompt id (every id a run
    accepts is text), and is judged unreadable as it is."""
    ids: list[str] = []
    unnamed: list[Checked[Any]] = []
    for member in members:
        try:
            ids.append(member.decode())
        except UnicodeDecodeError:
            shown = member.decode(errors="backslashreplace")
            detail = "its field is not UTF-8 text: no prompt id is"
            entry = quarantined(
                kind, shown, None, QuarantineReason.UNREADABLE, detail, inflated_limit_bytes=PREVIEW_BYTES
            )
            unnamed.append(Checked(shown, None, entry, real_prompt=False, raw_field=member))
    return ids, unnamed


def judge_staged(
    field: str, blob: bytes | None, view: RunView, column_types: Mapping[str, str] | None = None
) -> Checked[Completion]:
    """A staged completion held against its field and the run (its kept columns against the run's
    `column_types`)."""

    def kept_apart(reason: str, detail: str) -> Checked[Completion]:
        entry = quarantined(
            QuarantineKind.STAGED, field, blob, reason, detail, inflated_limit_bytes=RECORD_LIMIT_BYTES
        )
        return Checked(field, None, entry, view.accepted)

    if blob is None:
        return kept_apart(QuarantineReason.MISSING_RECORD, "in the staged index with no completion staged")
    try:
        data = inflate(blob, limit_bytes=RECORD_LIMIT_BYTES)
        completion = decode_json(data, Completion, limit_bytes=RECORD_LIMIT_BYTES)
    except RecordUnreadable as error:
        entry = unreadable(QuarantineKind.STAGED, field, blob, error, inflated_limit_bytes=RECORD_LIMIT_BYTES)
        spent = RECORD_LIMIT_BYTES if error.reason == OVER_LIMIT else len(blob)  # at most, to refuse it
        return Checked(field, None, entry, view.accepted, inflated_bytes=spent)
    if (problem := columns_problem(completion.columns, column_types)) is not None:
        return kept_apart(QuarantineReason.UNREADABLE, f"not a completion of this run: it {problem}")
    refusal = _refusal(field, completion.prompt_id, view, completion_of_dead=True)
    if refusal is not None:
        return kept_apart(*refusal)
    return Checked(field, completion, None, view.accepted, inflated_bytes=len(data))


def judge_dead_letter(field: str, raw: bytes | None, view: RunView) -> Checked[DeadLetter]:
    """A pending dead letter held against its field and the run."""

    def kept_apart(reason: str, detail: str) -> Checked[DeadLetter]:
        entry = quarantined(
            QuarantineKind.DEAD_LETTER,
            field,
            raw,
            reason,
            detail,
            inflated_limit_bytes=SMALL_RECORD_LIMIT_BYTES,
        )
        return Checked(field, None, entry, view.accepted)

    if raw is None:
        return kept_apart(QuarantineReason.MISSING_RECORD, "pending upload with no dead letter")
    try:
        letter = decode_json(raw, DeadLetter, limit_bytes=SMALL_RECORD_LIMIT_BYTES)
    except RecordUnreadable as error:
        return kept_apart(error.reason, str(error))
    refusal = _refusal(field, letter.prompt_id, view, completion_of_dead=False)
    if refusal is not None:
        return kept_apart(*refusal)
    return Checked(field, letter, None, view.accepted, inflated_bytes=len(raw))


def _refusal(field: str, held: str, view: RunView, *, completion_of_dead: bool) -> tuple[str, str] | None:
    if held != field:
        return QuarantineReason.PROMPT_ID_MISMATCH, f"under {field!r}, it holds prompt {held!r}"
    if not view.accepted:
        return QuarantineReason.NOT_ACCEPTED, f"{field!r} is in none of the run's id buckets"
    if view.done:
        return QuarantineReason.ALREADY_COMMITTED, f"{field!r} is committed already"
    if completion_of_dead and view.dead:
        return QuarantineReason.ALREADY_DEAD_LETTERED, f"{field!r} is dead-lettered already"
    return None


def check_staged_record(client: redis.Redis, run: str, field: str, blob: bytes | None) -> Checked[Completion]:
    """Whether the uploader would commit this staged record (`record`), or quarantine it (`quarantined`,
    with its reason), as the run stands in Redis now."""
    keys = RunKeys(run)
    (view,) = read_views(client, keys, [field])
    return judge_staged(field, blob, view)
