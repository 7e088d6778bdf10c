"""Flushing a run's staged completions into committed objects.

One flush at a time per run (a Redis lock with a token). Each part: choose the oldest staged
completions (up to a count and a byte budget), write the object under a content-derived key, create
its manifest entry if absent (the commit point), then mark its prompts done in Redis in one atomic
step. A flush interrupted after the manifest entry is adopted by the next one, so nothing is
committed twice.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

from inference.records import Completion
from workers.codec import decode_blob
from workers.errors import RetryLater, UploadLockLost
from workers.ledger import RunLedger
from workers.manifest import ManifestEntry, data_key, decode_entry, encode_entry, manifest_key
from workers.parquet_io import completions_to_parquet, prompt_ids_in
from workers.protocol import Scripts
from workers.settings import UploadSettings
from workers.storage import ObjectStore

log = logging.getLogger(__name__)

LOCK_BUSY_RETRY_S = 5.0
MS_PER_S = 1000

@dataclass
class FlushReport:
    parts: int = 0
    completions: int = 0
    adopted_parts: int = 0


@dataclass(frozen=True)
class Selection:
    prompt_ids: list[str]
    blobs: list[bytes]


class Uploader:
    def __init__(
        self, client: redis.Redis, settings: UploadSettings, store_for_run: Callable[[str], ObjectStore]
    ) -> None:
        self.client = client
        self.settings = settings
        self.store_for_run = store_for_run
        self._scripts = Scripts.register(client)

    def flush(self, run: str) -> FlushReport:
        """Commit every part that is due. Raises RetryLater when another flush holds the run."""
        ledger = RunLedger(self.client, run)
        token = uuid.uuid4().hex
        lock_ms = int(self.settings.lock_s * MS_PER_S)
        if not self.client.set(ledger.keys.upload_lock, token, nx=True, px=lock_ms):
            raise RetryLater(f"another flush of run {run!r} is running", delay_s=LOCK_BUSY_RETRY_S)
        report = FlushReport()
        store = self.store_for_run(run)
        try:
            while (selection := self._due(ledger)) is not None:
                if not self._scripts.extend_lock(keys=[ledger.keys.upload_lock], args=[token, lock_ms]):
                    raise UploadLockLost(f"upload lock of {run!r} expired", delay_s=LOCK_BUSY_RETRY_S)
                self._commit_part(ledger, store, token, selection, report)
        finally:
            self._scripts.release_lock(keys=[ledger.keys.upload_lock], args=[token])
        return report

    def _due(self, ledger: RunLedger) -> Selection | None:
        """The next part's completions if one is due: full by count or bytes, old, or the run drained."""
        keys = ledger.keys
        oldest = self.client.zrange(keys.staged_index, 0, self.settings.max_completions - 1, withscores=True)
        if not oldest:
            return None
        staged_bytes = int(self.client.get(keys.staged_bytes) or 0)
        seconds, micros = self.client.time()
        age_s = seconds + micros / 1e6 - oldest[0][1]
        due = (
            len(oldest) >= self.settings.max_completions
            or staged_bytes >= self.settings.max_bytes
            or age_s >= self.settings.max_age_s
            or ledger.counts().remaining <= 0
        )
        if not due:
            return None
        ids = [member.decode() for member, _score in oldest]
        blobs = self.client.hmget(keys.staged, ids)
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
        return Selection(chosen_ids, chosen_blobs) if chosen_ids else None

    def _commit_part(
        self, ledger: RunLedger, store: ObjectStore, token: str, selection: Selection, report: FlushReport
    ) -> None:
        part = int(self.client.get(ledger.keys.next_part) or 0)
        completions = [decode_blob(blob, Completion) for blob in selection.blobs]
        data = completions_to_parquet(completions)
        checksum = hashlib.sha256(data).hexdigest()
        entry = ManifestEntry(
            part=part,
            key=data_key(part, checksum),
            count=len(completions),
            bytes=len(data),
            sha256=checksum,
            committed_at=time.time(),
        )
        store.put(entry.key, data)
        prompt_ids = selection.prompt_ids
        if not store.put_if_absent(manifest_key(part), encode_entry(entry)):
            entry = decode_entry(store.get(manifest_key(part)))
            prompt_ids = prompt_ids_in(store.get(entry.key))
            report.adopted_parts += 1
            log.warning(
                "run %s part %d was committed by an interrupted flush; adopting it", ledger.keys.run, part
            )
        try:
            ledger.commit(
                lock_token=token, part=part, manifest_entry=encode_entry(entry), prompt_ids=prompt_ids
            )
        except redis.ResponseError as error:
            raise UploadLockLost(
                f"commit of part {part} refused: {error}", delay_s=LOCK_BUSY_RETRY_S
            ) from error
        report.parts += 1
        report.completions += entry.count
        log.info(
            "run %s: committed part %d (%d completions, %d bytes) as %s",
            ledger.keys.run,
            part,
            entry.count,
            entry.bytes,
            entry.key,
        )
