"""The quarantine: records read back from Redis that could not be trusted, kept apart with their reason.

A staged completion or pending dead letter that cannot be read, that holds another prompt than its
field names, whose id the run never accepted, or whose prompt is settled already, leaves the upload
path (QUARANTINE_RECORD): it is never committed and never marks its prompt done, and the rest of the
run commits as usual. A real prompt it held is generated again (its finished batch is re-opened). A
batch whose body cannot be read leaves the open batches (QUARANTINE_BATCH): its prompts are held by no
batch, and an `enqueue` re-run batches them again. Each is kept in the run's `quarantined` hash, and
the uploader writes the same entries to the output under `quarantine/` (never manifest-listed), so
`verify` lists them with Redis gone.
"""

from __future__ import annotations

import enum
import time

import msgspec
import redis

from core.records import Record
from workers.errors import RecordUnreadable
from workers.state.codec import decode_json, preview
from workers.state.keys import RunKeys
from workers.state.protocol import Scripts
from workers.state.record_limits import PREVIEW_BYTES, SMALL_RECORD_LIMIT_BYTES

SCAN_COUNT = 1000
STALE = "STALE"  # QUARANTINE_RECORD's refusal: a batch finished since the caller looked


class QuarantineKind(enum.StrEnum):
    """Where a quarantined record was read."""

    STAGED = "staged"  # a completion handed over for upload
    DEAD_LETTER = "dead_letter"  # a dead letter waiting for upload
    BATCH = "batch"  # an open batch's body (its prompts)
    FINISHED_BATCH = "finished_batch"  # a finished batch's body, kept until its prompts are committed


PROMPT_KINDS = frozenset({QuarantineKind.STAGED.value, QuarantineKind.DEAD_LETTER.value})  # ids are prompts


class QuarantineReason(enum.StrEnum):
    """Why a record was not trusted: a short, stable category (the entry's `detail` says the rest)."""

    UNREADABLE = "unreadable"  # not a whole zstd frame, not JSON, or not the record it should be
    OVER_LIMIT = "over_limit"  # inflates past what a real record can be (workers/state/record_limits.py)
    PROMPT_ID_MISMATCH = "prompt_id_mismatch"  # holds another prompt than its field names
    NOT_ACCEPTED = "not_accepted"  # an id the run never accepted (in none of its id buckets)
    ALREADY_COMMITTED = "already_committed"  # its prompt is committed already
    ALREADY_DEAD_LETTERED = "already_dead_lettered"  # a completion of a prompt that is dead-lettered
    MISSING_RECORD = "missing_record"  # an index entry with no record under it
    BATCH_ID_MISMATCH = "batch_id_mismatch"  # a batch body under another batch's key


class Regeneration(enum.StrEnum):
    """What became of the prompt of a quarantined record (QUARANTINE_RECORD's answer)."""

    SETTLED = "settled"  # nothing to generate: not the run's, or committed or dead-lettered already
    REOPENED = "reopened"  # its finished batch is open again, to be dispatched
    OPEN = "open"  # its batch is being generated: FINISH_BATCH refuses it until the prompt is settled
    UNFINISHED = "unfinished"  # no finished batch holds it: its batch is open, or gone (`recover`)
    GONE = "gone"  # its finished batch's body is lost: an `enqueue` re-run batches it again


class QuarantinedRecord(Record, frozen=True):
    kind: str  # a QuarantineKind value
    id: str  # the prompt id (the field it was under), or the batch id
    reason: str  # a QuarantineReason value
    detail: str
    at: float  # unix seconds, when it was quarantined
    size: int  # bytes as stored
    preview: str  # the first bytes of what it held, inflated when it could be

    @property
    def field(self) -> str:
        """Its field in the run's `quarantined` hash: kind and id, so a prompt's two records stay apart."""
        return quarantine_field(self.kind, self.id)


def quarantine_field(kind: str, record_id: str) -> str:
    return f"{kind}:{record_id}"


def quarantined(
    kind: QuarantineKind,
    record_id: str,
    raw: bytes | None,
    reason: str,
    detail: str,
    *,
    inflated_limit_bytes: int,
) -> QuarantinedRecord:
    """The entry of a record (`raw` as stored, None when missing) not trusted for `reason`."""
    shown = "" if raw is None else preview(raw, shown_bytes=PREVIEW_BYTES, limit_bytes=inflated_limit_bytes)
    return QuarantinedRecord(
        kind=kind.value,
        id=record_id,
        reason=reason,
        detail=detail[:PREVIEW_BYTES],
        at=time.time(),
        size=0 if raw is None else len(raw),
        preview=shown,
    )


def unreadable(
    kind: QuarantineKind, record_id: str, raw: bytes, error: RecordUnreadable, *, inflated_limit_bytes: int
) -> QuarantinedRecord:
    return quarantined(
        kind, record_id, raw, error.reason, str(error), inflated_limit_bytes=inflated_limit_bytes
    )


def encode_entry(entry: QuarantinedRecord) -> bytes:
    return msgspec.json.encode(entry)


def decode_entry(raw: bytes) -> QuarantinedRecord | None:
    """An entry read back (from Redis or the output), or None when it is not one."""
    try:
        return decode_json(raw, QuarantinedRecord, limit_bytes=SMALL_RECORD_LIMIT_BYTES)
    except RecordUnreadable:
        return None


class Quarantine:
    """A run's quarantine: the Python face of QUARANTINE_RECORD and QUARANTINE_BATCH, and its reading."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        self.client = client
        self.keys = RunKeys(run)
        self._scripts = Scripts.register(client)

    def record(
        self,
        entry: QuarantinedRecord,
        *,
        lock_token: str,
        batch_id: str,
        real_prompt: bool,
        field: bytes | str | None = None,
    ) -> Regeneration:
        """Take a staged completion or pending dead letter off the upload path, its `field` as Redis holds
        it (the entry's id unless given). Raises redis.ResponseError STALE when `batch_id`, what
        finished_prompts said of the prompt, is no longer so."""
        keys = self.keys
        result = self._scripts.quarantine_record(
            keys=[
                keys.done,
                keys.staged,
                keys.staged_index,
                keys.staged_bytes,
                keys.dead,
                keys.dead_pending,
                keys.upload_lock,
                keys.quarantined,
                keys.finished_prompts,
                keys.finished_batches,
                keys.open_batches,
                keys.finished_batch(batch_id),
                keys.batch(batch_id),
            ],
            args=[
                lock_token,
                entry.id if field is None else field,
                "staged" if entry.kind == QuarantineKind.STAGED else "dead",
                entry.field,
                encode_entry(entry),
                batch_id,
                "1" if real_prompt else "0",
            ],
        )
        return Regeneration(result.decode() if isinstance(result, bytes) else result)

    def finished_batch_of(self, prompt_id: bytes | str) -> str:
        """The finished batch whose kept body holds the prompt, '' when none."""
        raw = self.client.hget(self.keys.finished_prompts, prompt_id)
        return raw.decode() if raw is not None else ""

    def batch(self, entry: QuarantinedRecord) -> None:
        """An open batch whose body cannot be read leaves the open batches, its lease with it."""
        keys = self.keys
        self._scripts.quarantine_batch(
            keys=[
                keys.batch(entry.id),
                keys.open_batches,
                keys.leases,
                keys.lease_owners,
                keys.batch_failures,
                keys.quarantined,
            ],
            args=[entry.id, entry.field, encode_entry(entry)],
        )

    def count(self) -> int:
        return int(self.client.hlen(self.keys.quarantined))

    def entries(self, most: int | None = None) -> list[QuarantinedRecord]:
        """Up to `most` entries, or all (an entry that does not decode is left out)."""
        found: list[QuarantinedRecord] = []
        for _field, raw in self.client.hscan_iter(self.keys.quarantined, count=SCAN_COUNT):
            entry = decode_entry(raw)
            if entry is not None:
                found.append(entry)
            if most is not None and len(found) >= most:
                break
        return found
