"""Flushing a run's staged completions and dead letters into committed objects.

One flush at a time per run (a Redis lock with a token). Each part: choose the oldest staged
completions (up to a count and a byte budget, counted as stored and as inflated) and dead letters (up
to the same count), each held against its field and the run (workers/record/record_checks.py): those
that cannot be trusted are quarantined (kept in the output under `quarantine/`, then taken off the
upload path, a real prompt's finished batch re-opened to generate it again), the rest written under
content-derived keys; then the part's manifest entry is created if absent (the commit point), and its
prompts marked done and its dead letters committed in Redis in one atomic step. A flush interrupted
after the manifest entry is adopted by the next one, so nothing is committed twice. After each part the
kept bodies of finished batches whose prompts are all committed are forgotten
(workers/record/finished_bodies.py). Nothing of a run is written to an output whose run.json does not
name that run and that output (workers/record/output_pin.py): the run is paused instead.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import redis

from core.records import Completion, DeadLetter
from inference.server_facts import ServerFacts, encode_facts, facts_id
from workers.errors import ObjectMissing, RecordUnreadable, RetryLater, RunBroken, UploadLockLost
from workers.periodic import PeriodicThread
from workers.record.finished_bodies import FinishedBodies
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
from workers.record.quarantine_output import write_quarantined
from workers.record.reading import read_part
from workers.record.record_checks import (
    Checked,
    RunView,
    judge_dead_letter,
    judge_staged,
    named,
    read_views,
)
from workers.record.upload_settings import UploadSettings
from workers.state.codec import decode_json
from workers.state.keys import SERVERS_KEY
from workers.state.ledger import RunLedger
from workers.state.protocol import Scripts
from workers.state.quarantine import STALE, Quarantine, QuarantinedRecord, QuarantineKind, Regeneration
from workers.state.record_limits import SMALL_RECORD_LIMIT_BYTES, batch_body_limit_bytes
from workers.state.redis_client import redis_now_s
from workers.state.runs import load_run_settings

log = logging.getLogger(__name__)

LOCK_BUSY_RETRY_S = 5.0
LOCK_EXTENSIONS_A_TERM = 3  # the lock is extended this often within its term while a flush runs
MS_PER_S = 1000
# A part's completions inflated may hold this many times its byte budget (zstd keeps JSON with token ids
# to about a third): past it a part is not text, and the uploader's memory stays bounded whatever is staged.
INFLATED_BYTES_PER_STORED_BYTE = 4
STALE_LOOKS = 3  # looks for a quarantined prompt's finished batch while batches finish meanwhile


@dataclass
class FlushReport:
    parts: int = 0
    completions: int = 0
    adopted_parts: int = 0
    dead_letters: int = 0
    quarantined: int = 0
    reopened_batches: list[str] = field(default_factory=list)  # for the caller to dispatch
    finished_bodies_forgotten: int = 0


Suspects = list[Checked[Completion] | Checked[DeadLetter]]  # records judged not to be trusted


@dataclass(frozen=True)
class Selection:
    completions: list[Completion]
    dead_letters: list[DeadLetter]
    quarantined: Suspects

    @property
    def prompt_ids(self) -> list[str]:
        return [completion.prompt_id for completion in self.completions]

    @property
    def committable(self) -> bool:
        return bool(self.completions or self.dead_letters)


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
        self._finished_bodies = FinishedBodies(client, self._scripts)

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

        def keep_the_lock() -> None:  # while a part is written: a slow store's put may outlast the lock
            self._scripts.extend_lock(keys=[ledger.keys.upload_lock], args=[token, lock_ms])

        keeper = PeriodicThread(
            "draftgen-upload-lock", self.settings.lock_s / LOCK_EXTENSIONS_A_TERM, keep_the_lock
        )
        keeper.start()
        try:
            run_settings = load_run_settings(self.client, run)
            body_limit_bytes = batch_body_limit_bytes(run_settings.batch_size)
            while (selection := self._due(ledger, run_settings.column_types)) is not None:
                if not self._scripts.extend_lock(keys=[ledger.keys.upload_lock], args=[token, lock_ms]):
                    raise UploadLockLost(f"upload lock of {run!r} expired", delay_s=LOCK_BUSY_RETRY_S)
                self._quarantine(ledger, store, token, selection.quarantined, report)
                if selection.committable:
                    self._commit_part(ledger, store, token, selection, report, run_settings.column_types)
                    report.finished_bodies_forgotten += self._forget_finished(
                        ledger, store, token, body_limit_bytes
                    )
            if not report.parts and self._upload_path_empty(ledger):
                report.finished_bodies_forgotten += self._forget_finished(
                    ledger, store, token, body_limit_bytes
                )
        finally:
            keeper.stop()
            self._scripts.release_lock(keys=[ledger.keys.upload_lock], args=[token])
        return report

    def _due(self, ledger: RunLedger, column_types: dict[str, str] | None) -> Selection | None:
        """The next part if one is due: full by count or bytes, its oldest record old, or the run drained;
        each record judged (those not to be trusted are the selection's `quarantined`)."""
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
        staged_ids, unnamed = named([member for member, _score in oldest], QuarantineKind.STAGED)
        dead_ids, unnamed_dead = named([member for member, _score in oldest_dead], QuarantineKind.DEAD_LETTER)
        completions, suspects = self._completions(ledger, staged_ids, column_types)
        letters, bad_letters = self._dead_letters(ledger, dead_ids)
        selection = Selection(completions, letters, [*unnamed, *suspects, *unnamed_dead, *bad_letters])
        return selection if selection.committable or selection.quarantined else None

    def _completions(
        self, ledger: RunLedger, ids: list[str], column_types: dict[str, str] | None
    ) -> tuple[list[Completion], Suspects]:
        """The oldest staged completions that fit the byte budget, stored and inflated (at least one),
        and the records met on the way that are not to be trusted."""
        chosen: list[Completion] = []
        suspects: Suspects = []
        stored = inflated = 0
        for prompt_id, blob, view in self._with_views(ledger, ledger.keys.staged, ids):
            if chosen and blob is not None and stored + len(blob) > self.settings.max_bytes:
                break
            checked = judge_staged(prompt_id, blob, view, column_types)
            if checked.record is None:  # what refusing it inflated counts too: a part of bombs stays short
                suspects.append(checked)
                inflated += checked.inflated_bytes
                if inflated > self._inflated_budget_bytes:
                    break
                continue
            if chosen and inflated + checked.inflated_bytes > self._inflated_budget_bytes:
                break
            chosen.append(checked.record)
            stored += len(blob or b"")
            inflated += checked.inflated_bytes
        return chosen, suspects

    def _with_views(
        self, ledger: RunLedger, key: str, ids: list[str]
    ) -> list[tuple[str, bytes | None, RunView]]:
        """Each id with its record in the hash `key` (None when missing) and what the run holds of it."""
        if not ids:
            return []
        raws = self.client.hmget(key, ids)
        views = read_views(self.client, ledger.keys, ids, staged=False)  # not what the checks ask
        return list(zip(ids, raws, views, strict=True))

    @property
    def _inflated_budget_bytes(self) -> int:
        return self.settings.max_bytes * INFLATED_BYTES_PER_STORED_BYTE

    def _dead_letters(self, ledger: RunLedger, ids: list[str]) -> tuple[list[DeadLetter], Suspects]:
        letters: list[DeadLetter] = []
        suspects: Suspects = []
        for prompt_id, raw, view in self._with_views(ledger, ledger.keys.dead, ids):
            checked = judge_dead_letter(prompt_id, raw, view)
            if checked.record is None:
                suspects.append(checked)
            else:
                letters.append(checked.record)
        return letters, suspects

    def _quarantine(
        self,
        ledger: RunLedger,
        store: ObjectStore,
        token: str,
        suspects: Suspects,
        report: FlushReport,
    ) -> None:
        """Keep the suspects apart: in the output first (the output is the record), then off the upload
        path in Redis, a real prompt's finished batch re-opened."""
        entries = [suspect.quarantined for suspect in suspects if suspect.quarantined is not None]
        if not entries:
            return
        write_quarantined(store, entries)
        quarantine = Quarantine(self.client, ledger.keys.run)
        for suspect, entry in zip(suspects, entries, strict=True):
            became, batch_id = self._quarantine_one(quarantine, token, entry, suspect)
            if became is Regeneration.REOPENED and batch_id not in report.reopened_batches:
                report.reopened_batches.append(batch_id)
            log.error(
                "run %s: %s %s quarantined (%s: %s); its prompt: %s",
                ledger.keys.run,
                entry.kind,
                entry.id,
                entry.reason,
                entry.detail,
                became.value,
            )
            report.quarantined += 1

    def _quarantine_one(
        self,
        quarantine: Quarantine,
        token: str,
        entry: QuarantinedRecord,
        suspect: Checked[Completion] | Checked[DeadLetter],
    ) -> tuple[Regeneration, str]:
        """What became of the entry's prompt, and the finished batch that held it ('' for none)."""
        for _look in range(STALE_LOOKS):
            batch_id = quarantine.finished_batch_of(suspect.redis_field)
            try:
                became = quarantine.record(
                    entry,
                    lock_token=token,
                    batch_id=batch_id,
                    real_prompt=suspect.real_prompt,
                    field=suspect.redis_field,
                )
            except redis.ResponseError as error:
                if str(error).startswith(STALE):
                    continue
                raise UploadLockLost(
                    f"quarantine of {entry.id} refused: {error}", delay_s=LOCK_BUSY_RETRY_S
                ) from error
            return became, batch_id
        raise RetryLater(
            f"the batch of {entry.id} kept finishing while it was quarantined", delay_s=LOCK_BUSY_RETRY_S
        )

    def _forget_finished(
        self, ledger: RunLedger, store: ObjectStore, token: str, body_limit_bytes: int
    ) -> int:
        try:
            return self._finished_bodies.forget_committed(
                ledger.keys,
                token,
                body_limit_bytes=body_limit_bytes,
                keep_in_output=lambda entries: write_quarantined(store, entries),
            )
        except redis.ResponseError as error:
            raise UploadLockLost(
                f"finished bodies of {ledger.keys.run}: {error}", delay_s=LOCK_BUSY_RETRY_S
            ) from error

    def _upload_path_empty(self, ledger: RunLedger) -> bool:
        counts = ledger.counts()
        return counts.staged == 0 and counts.dead_pending == 0

    def _commit_part(
        self,
        ledger: RunLedger,
        store: ObjectStore,
        token: str,
        selection: Selection,
        report: FlushReport,
        column_types: dict[str, str] | None,
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
        if selection.completions:
            completions = selection.completions
            self._write_server_facts(store, completions)
            data = completions_to_parquet(completions, column_types)
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
            facts = self._server_facts(identity)
            if facts is None:
                continue
            store.put_if_absent(server_key(identity), facts)
            self._servers_written.add((store.url, identity))

    def _server_facts(self, identity: str) -> bytes | None:
        """A server's facts as Redis holds them, when they are facts and the ones their id names."""
        raw = self.client.hget(SERVERS_KEY, identity)
        if raw is None:
            log.warning("server facts %s are not in Redis: rows naming them keep the id only", identity)
            return None
        try:
            facts = decode_json(raw, ServerFacts, limit_bytes=SMALL_RECORD_LIMIT_BYTES)
        except RecordUnreadable as error:
            log.error("server facts %s cannot be read, not written to the output: %s", identity, error)
            return None
        if facts_id(facts) != identity:
            log.error("server facts %s are not the facts their id names: not written to the output", identity)
            return None
        return encode_facts(facts)
