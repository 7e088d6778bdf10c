"""Rebuild a run's Redis state from its output after Redis was lost: committed work is never lost.

The object store holds the run's settings (`run.json`, written at every enqueue), its manifest (parts
of completions and dead letters), the ids each enqueue claimed and the rows it rejected. From them this
restores the pinned settings, the `done` set, the run's ids (with the fingerprints of explicit ids) and
the enqueues' notes, the dead letters, the rejected rows, the Redis copy of the manifest and the next
part number. Re-running `enqueue` with the same data then
queues only what was never committed; a generate worker skips any prompt already in `done`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import msgspec
import redis

from core.records import DeadLetter
from core.run_settings.model import RunSettings, differences
from intake.rows import rejection_key
from producer.enqueue.file_numbers import FileNumbers
from producer.enqueue.fingerprints import Fingerprint
from producer.errors import RunNotFound, SettingsError
from workers.errors import ObjectMissing, RecordUnreadable
from workers.record.enqueued import EnqueueNote
from workers.record.manifest import SETTINGS_KEY, encode_entry
from workers.record.object_store import ObjectStore
from workers.record.output_pin import run_json_of
from workers.record.reading import read_committed, read_enqueued_chunks, read_rejections
from workers.state.keys import ID_BUCKETS, RUNS_KEY, RunKeys, id_bucket
from workers.state.ledger import RunLedger
from workers.state.protocol import Scripts
from workers.state.runs import decode_run_settings, encode_run_settings

IDS_PER_COMMAND = 10_000
LEGACY_HOLDER = b"0"  # an id whose enqueue is not known


@dataclass
class RecoverReport:
    parts: int = 0
    committed: int = 0
    newly_marked_done: int = 0
    settings_restored: bool = False
    enqueued: int = 0
    fingerprints: int = 0
    dead_letters: int = 0
    rejected_rows: int = 0


def read_run_settings(store: ObjectStore, run: str) -> RunSettings:
    """Run `run`'s settings as its output's run.json holds them (RunNotFound without one; OutputTaken when
    the output is another run's)."""
    try:
        return run_json_of(store, run)
    except ObjectMissing as error:
        raise RunNotFound(f"{store.url} holds no {SETTINGS_KEY}: is this a run's output?") from error


def _restore_records(
    client: redis.Redis, keys: RunKeys, store: ObjectStore, dead: dict[str, DeadLetter], report: RecoverReport
) -> None:
    """The committed dead letters and rejected rows the output holds, back into Redis."""
    letters = list(dead.values())
    for start in range(0, len(letters), IDS_PER_COMMAND):
        with client.pipeline(transaction=False) as pipe:
            for letter in letters[start : start + IDS_PER_COMMAND]:
                pipe.hsetnx(keys.dead, letter.prompt_id, msgspec.json.encode(letter))
            pipe.execute()
    report.dead_letters = len(letters)
    rejections = read_rejections(store)
    for start in range(0, len(rejections), IDS_PER_COMMAND):
        mapping = {
            rejection_key(stored.source, stored.rejected): msgspec.json.encode(stored.rejected)
            for stored in rejections[start : start + IDS_PER_COMMAND]
        }
        client.hset(keys.rejected, mapping=mapping)
    report.rejected_rows = len(rejections)


def _restore_enqueued(
    client: redis.Redis, keys: RunKeys, holding: _IdHolding, store: ObjectStore, report: RecoverReport
) -> None:
    """Every id an enqueue claimed, each with its holder from its latest enqueue (an explicit id's
    fingerprint, or the enqueue's number), unless Redis holds it (then as recent); the enqueues' notes
    when Redis holds none. Conflicts are then told and named as before the loss."""
    latest: dict[str, tuple[int, str]] = {}
    notes: dict[int, EnqueueNote] = {}
    for chunk in read_enqueued_chunks(store):  # each object read once
        if chunk.enqueue_number:  # 0: written before the notes were kept
            notes[chunk.enqueue_number] = chunk.note
        for prompt_id in chunk.ids:
            encoded = chunk.fingerprints.get(prompt_id, "")
            known = Fingerprint.decode(encoded.encode()) is not None
            holder = (chunk.enqueue_number, encoded if known else str(chunk.enqueue_number))
            latest[prompt_id] = max(latest.get(prompt_id, holder), holder)
    holding.hold({prompt_id: holder for prompt_id, (_n, holder) in latest.items()})
    report.enqueued = len(latest)
    report.fingerprints = sum(1 for _n, holder in latest.values() if not holder.isdigit())
    _restore_notes(client, keys, notes)


@dataclass(frozen=True)
class _IdHolding:
    """Puts ids into the run's buckets, each with its holder (an explicit id's file by number)."""

    ledger: RunLedger
    files: FileNumbers

    @classmethod
    def of(cls, client: redis.Redis, keys: RunKeys) -> _IdHolding:
        return cls(RunLedger(client, keys.run), FileNumbers(client, keys, Scripts.register(client)))

    def hold(self, holders: dict[str, str]) -> None:
        items = sorted(holders.items())
        for start in range(0, len(items), IDS_PER_COMMAND):
            ids, named = zip(*items[start : start + IDS_PER_COMMAND], strict=True)
            self.ledger.hold_ids(dict(zip(ids, self.files.numbered(list(named)), strict=True)))


def _move_legacy_ids(client: redis.Redis, keys: RunKeys, holding: _IdHolding) -> None:
    """A run enqueued by draftgen 0.1.0 kept its ids in one set and the fingerprints of explicit ids in
    hashes of the same buckets: both move to the id buckets, and the old keys go."""
    if not client.exists(keys.legacy_enqueued):
        return
    members = client.sscan_iter(keys.legacy_enqueued, count=IDS_PER_COMMAND)
    while ids := [member.decode() for member in islice(members, IDS_PER_COMMAND)]:
        with client.pipeline(transaction=False) as pipe:
            for prompt_id in ids:
                pipe.hget(f"{keys.legacy_fingerprints_prefix}{id_bucket(prompt_id)}", prompt_id)
            found = pipe.execute()
        holding.hold(
            {prompt_id: (raw or LEGACY_HOLDER).decode() for prompt_id, raw in zip(ids, found, strict=True)}
        )
    with client.pipeline(transaction=False) as pipe:
        pipe.unlink(keys.legacy_enqueued)
        for bucket in range(ID_BUCKETS):
            pipe.unlink(f"{keys.legacy_fingerprints_prefix}{bucket}")
        pipe.execute()


def _restore_notes(client: redis.Redis, keys: RunKeys, notes: dict[int, EnqueueNote]) -> None:
    if notes and not client.exists(keys.enqueues):
        unknown = EnqueueNote(source="", at=0.0)  # an enqueue that claimed nothing new left no note
        client.rpush(
            keys.enqueues,
            *(msgspec.json.encode(notes.get(n, unknown)) for n in range(1, max(notes) + 1)),
        )


def recover_run(client: redis.Redis, store: ObjectStore, run: str) -> RecoverReport:
    report = RecoverReport()
    stored = read_run_settings(store, run)
    keys = RunKeys(run)
    report.settings_restored = bool(client.set(keys.settings, encode_run_settings(stored), nx=True))
    try:
        pinned = decode_run_settings(client.get(keys.settings))
    except RecordUnreadable:  # unreadable (a NaN pinned as null by an older version): the output's wins
        client.set(keys.settings, encode_run_settings(stored))
        report.settings_restored = True
        pinned = stored
    changed = differences(pinned, stored)
    if changed:
        raise SettingsError(
            "Redis pins other settings than the output's run.json:\n  " + "\n  ".join(changed)
        )
    client.sadd(RUNS_KEY, run)
    holding = _IdHolding.of(client, keys)
    _move_legacy_ids(client, keys, holding)
    _restore_enqueued(
        client, keys, holding, store, report
    )  # first: a committed id then keeps its enqueue's holder
    ledger = holding.ledger
    committed = read_committed(store)
    entries = committed.entries
    ids = list(committed.completed)
    for start in range(0, len(ids), IDS_PER_COMMAND):
        report.newly_marked_done += ledger.mark_committed(ids[start : start + IDS_PER_COMMAND])
    report.committed = len(ids)
    report.parts = len(entries)
    _restore_records(client, keys, store, committed.dead, report)
    if entries:
        with client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.manifest)
            pipe.rpush(keys.manifest, *(encode_entry(entry) for entry in entries))
            pipe.set(keys.next_part, max(int(client.get(keys.next_part) or 0), entries[-1].part + 1))
            pipe.execute()
    return report
