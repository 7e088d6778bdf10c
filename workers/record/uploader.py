"""Flushing a run's staged completions and dead letters into committed objects.

One flush at a time per run (a Redis lock with a token). Each part: choose the oldest staged
completions (up to a count and a byte budget) and dead letters (up to the same count), write their
objects under content-derived keys, create the part's manifest entry if absent (the commit point),
then mark its prompts done and its dead letters committed in Redis in one atomic step. A flush
interrupted after the manifest entry is adopted by the next one, so nothing is committed twice.
Nothing of a run is written to an output whose run.json does not name that run and that output
(workers/record/output_pin.py): the run is paused instead.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import redis

from inference.records import Completion, DeadLetter
from workers.errors import ObjectMissing, RetryLater, RunBroken, UploadLockLost
from workers.record.jsonl_io import to_jsonl
from workers.record.manifest import (
    ManifestEntry,
    ObjectRef,
    data_key,
    dead_key,
    decode_entry,
    encode_entry,
    manifest_key,
    server_key,
)
from workers.record.object_store import ObjectStore
from workers.record.output_pin import OutputPin
from workers.record.parquet_io import completions_to_parquet
from workers.record.reading import read_part
from workers.record.upload_settings import UploadSettings
from workers.state.codec import decode_blob
from workers.state.keys import SERVERS_KEY
from workers.state.ledger import RunLedger
from workers.state.protocol import Scripts
from workers.state.redis_client import redis_now_s

log = logging.getLogger(__name__)

LOCK_BUSY_RETRY_S = 5.0
MS_PER_S = 1000


@dataclass
class FlushReport:
    parts: int = 0
    completions: int = 0
    adopted_parts: int = 0
    dead_letters: int = 0


@dataclass(frozen=True)
class Selection:
    prompt_ids: list[str]
    blobs: list[bytes]
    dead_letters: list[DeadLetter]


class Uploader:
    def __init__(
        self, client: redis.Redis, settings: UploadSettings, store_for_run: Callable[[str], ObjectStore]
    ) -> None:
        self.client = client
        self.settings = settings
        self.store_for_run = store_for_run
        self._scripts = Scripts.register(client)
        self._servers_written: set[tuple[str, str]] = set()  # (output URL, facts id)
        self._output_pin = OutputPin(client)

    def flush(self, run: str) -> FlushReport:
        """Commit every part that is due. Raises RetryLater when another flush holds the run.
        Commits nothing (and pauses the run) when the output's run.json does not confirm it."""
        ledger = RunLedger(self.client, run)
        report = FlushReport()
        store = self.store_for_run(run)
        if not self._output_pin.confirm(run, store):
            return report
        token = uuid.uuid4().hex
        lock_ms = int(self.settings.lock_s * MS_PER_S)
        if not self.client.set(ledger.keys.upload_lock, token, nx=True, px=lock_ms):
            raise RetryLater(f"another flush of run {run!r} is running", delay_s=LOCK_BUSY_RETRY_S)
        try:
            while (selection := self._due(ledger)) is not None:
                if not self._scripts.extend_lock(keys=[ledger.keys.upload_lock], args=[token, lock_ms]):
                    raise UploadLockLost(f"upload lock of {run!r} expired", delay_s=LOCK_BUSY_RETRY_S)
                self._commit_part(ledger, store, token, selection, report)
        finally:
            self._scripts.release_lock(keys=[ledger.keys.upload_lock], args=[token])
        return report

    def _due(self, ledger: RunLedger) -> Selection | None:
        """The next part if one is due: full by count or bytes, its oldest record old, or the run drained."""
        keys = ledger.keys
        most = self.settings.max_completions
        oldest = self.client.zrange(keys.staged_index, 0, most - 1, withscores=True)
        oldest_dead = self.client.zrange(keys.dead_pending, 0, most - 1, withscores=True)
        if not oldest and not oldest_dead:
            return None
        staged_bytes = int(self.client.get(keys.staged_bytes) or 0)
        age_s = redis_now_s(self.client) - min(score for _member, score in [*oldest[:1], *oldest_dead[:1]])
        due = (
            len(oldest) >= most
            or len(oldest_dead) >= most
            or staged_bytes >= self.settings.max_bytes
            or age_s >= self.settings.max_age_s
            or ledger.counts().remaining <= 0
        )
        if not due:
            return None
        chosen_ids, chosen_blobs = self._completions(keys.staged, [m.decode() for m, _ in oldest])
        dead_ids = [member.decode() for member, _score in oldest_dead]
        letters = [
            msgspec.json.decode(raw, type=DeadLetter)
            for raw in (self.client.hmget(keys.dead, dead_ids) if dead_ids else [])
            if raw is not None
        ]
        if not chosen_ids and not letters:
            return None
        return Selection(chosen_ids, chosen_blobs, letters)

    def _completions(self, staged_key: str, ids: list[str]) -> tuple[list[str], list[bytes]]:
        """The oldest staged completions that fit the byte budget (at least one)."""
        blobs = self.client.hmget(staged_key, ids) if ids else []
        chosen_ids: list[str] = []
        chosen_blobs: list[bytes] = []
        total = 0
        for prompt_id, blob in zip(ids, blobs, strict=True):
            if blob is None:
                continue
            if chosen_blobs and total + len(blob) > self.settings.max_bytes:
                break
            chosen_ids.append(prompt_id)
            chosen_blobs.append(blob)
            total += len(blob)
        return chosen_ids, chosen_blobs

    def _commit_part(
        self, ledger: RunLedger, store: ObjectStore, token: str, selection: Selection, report: FlushReport
    ) -> None:
        run = ledger.keys.run
        part = int(self.client.get(ledger.keys.next_part) or 0)
        entry = ManifestEntry(
            part=part,
            key=None,
            count=0,
            bytes=0,
            sha256=None,
            committed_at=time.time(),
            run=run,
        )
        if selection.blobs:
            completions = [decode_blob(blob, Completion) for blob in selection.blobs]
            self._write_server_facts(store, completions)
            data = completions_to_parquet(completions)
            checksum = hashlib.sha256(data).hexdigest()
            store.put(data_key(part, checksum), data)
            entry = msgspec.structs.replace(
                entry, key=data_key(part, checksum), count=len(completions), bytes=len(data), sha256=checksum
            )
        if selection.dead_letters:
            ordered = sorted(selection.dead_letters, key=lambda letter: letter.prompt_id)
            dead_data = to_jsonl(ordered)
            dead_checksum = hashlib.sha256(dead_data).hexdigest()
            dead_ref = ObjectRef(
                key=dead_key(part, dead_checksum),
                count=len(selection.dead_letters),
                bytes=len(dead_data),
                sha256=dead_checksum,
            )
            store.put(dead_ref.key, dead_data)
            entry = msgspec.structs.replace(entry, dead=dead_ref)
        prompt_ids, dead_letters = selection.prompt_ids, selection.dead_letters
        if not store.put_if_absent(manifest_key(part), encode_entry(entry)):
            entry = decode_entry(store.get(manifest_key(part)))
            if entry.run and entry.run != run:
                raise RunBroken(
                    f"{store.url} part {part} was committed by run {entry.run!r}, not {run!r}: "
                    f"an output belongs to one run; nothing of run {run!r} is committed there"
                )
            adopted = read_part(store, entry)
            if adopted.absent:
                raise ObjectMissing(f"run {run} part {part} cannot be adopted: {adopted.absent} are absent")
            prompt_ids, dead_letters = adopted.completed, adopted.dead
            report.adopted_parts += 1
            log.warning("run %s part %d was committed by an interrupted flush; adopting it", run, part)
        try:
            ledger.commit(
                lock_token=token,
                part=part,
                manifest_entry=encode_entry(entry),
                prompt_ids=prompt_ids,
                dead_letters=dead_letters,
            )
        except redis.ResponseError as error:
            raise UploadLockLost(
                f"commit of part {part} refused: {error}", delay_s=LOCK_BUSY_RETRY_S
            ) from error
        report.parts += 1
        report.completions += entry.count
        report.dead_letters += entry.dead.count if entry.dead else 0
        log.info(
            "run %s: committed part %d (%d completions, %d dead letters, %d bytes) as %s",
            run,
            part,
            entry.count,
            entry.dead.count if entry.dead else 0,
            entry.bytes,
            entry.key,
        )

    def _write_server_facts(self, store: ObjectStore, completions: list[Completion]) -> None:
        """Each server the rows name gets its facts in the output once, before any entry points at them."""
        named = {c.origin.server for c in completions if c.origin.server is not None}
        for identity in sorted(named - {i for url, i in self._servers_written if url == store.url}):
            facts = self.client.hget(SERVERS_KEY, identity)
            if facts is None:
                log.warning("server facts %s are not in Redis: rows naming them keep the id only", identity)
                continue
            store.put_if_absent(server_key(identity), facts)
            self._servers_written.add((store.url, identity))
