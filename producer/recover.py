"""Rebuild a run's Redis state from its output after Redis was lost: committed work is never lost.

The object store holds the run's settings (`run.json`, written at every enqueue) and its manifest.
From them this restores the pinned settings, the `done` and `enqueued` sets, the Redis copy of the
manifest and the next part number. Re-running `enqueue` with the same data then queues only what was
never committed; a generate worker skips any prompt already in `done`.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from producer.errors import RunNotFound, SettingsError
from workers.keys import RUNS_KEY, RunKeys
from workers.ledger import RunLedger
from workers.manifest import SETTINGS_KEY, encode_entry, read_manifest
from workers.parquet_io import prompt_ids_in
from workers.runs import RunSettings, decode_run_settings, differences, encode_run_settings
from workers.storage import ObjectMissing, ObjectStore

IDS_PER_COMMAND = 10_000


@dataclass
class RecoverReport:
    parts: int = 0
    committed: int = 0
    newly_marked_done: int = 0
    settings_restored: bool = False


def write_run_settings(store: ObjectStore, settings: RunSettings) -> None:
    """Keep the run's settings beside its data (idempotent: the same bytes every time)."""
    store.put(SETTINGS_KEY, encode_run_settings(settings))


def read_run_settings(store: ObjectStore) -> RunSettings:
    try:
        return decode_run_settings(store.get(SETTINGS_KEY))
    except ObjectMissing as error:
        raise RunNotFound(f"{store.url} holds no {SETTINGS_KEY}: is this a run's output?") from error


def recover_run(client: redis.Redis, store: ObjectStore, run: str) -> RecoverReport:
    report = RecoverReport()
    stored = read_run_settings(store)
    if stored.run != run:
        raise SettingsError(f"{store.url} belongs to run {stored.run!r}, not {run!r}")
    keys = RunKeys(run)
    report.settings_restored = bool(client.set(keys.settings, encode_run_settings(stored), nx=True))
    pinned = decode_run_settings(client.get(keys.settings))
    changed = differences(pinned, stored)
    if changed:
        raise SettingsError(
            "Redis pins other settings than the output's run.json:\n  " + "\n  ".join(changed)
        )
    client.sadd(RUNS_KEY, run)
    ledger = RunLedger(client, run)
    entries = read_manifest(store)
    for entry in entries:
        ids = prompt_ids_in(store.get(entry.key))
        for start in range(0, len(ids), IDS_PER_COMMAND):
            report.newly_marked_done += ledger.mark_committed(ids[start : start + IDS_PER_COMMAND])
        report.committed += len(ids)
    report.parts = len(entries)
    if entries:
        with client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.manifest)
            pipe.rpush(keys.manifest, *(encode_entry(entry) for entry in entries))
            pipe.set(keys.next_part, max(int(client.get(keys.next_part) or 0), entries[-1].part + 1))
            pipe.execute()
    return report
