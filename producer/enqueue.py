"""Enqueue a stream of prompts into a run: only what is new, batched, compressed, and never lost.

Each chunk's new ids are first written to the object store (`enqueued/`, so the output alone says
what the run was asked to do), then, in one atomic Redis step, join the run's `enqueued` set together
with the batches that carry them and the outbox entry of each batch. Only then are the batch
messages published, and each batch leaves the outbox once published. A crash anywhere leaves
either nothing or batches in the outbox, which the next `enqueue` publishes first. Rejected rows go
to the object store too (`rejected/`). One enqueue of a run works at a time (a lease in Redis), so a
prompt is never placed in two batches by two enqueues racing.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice

import msgspec
import redis

from inference.records import Prompt, PromptBatch, Record
from producer.errors import EnqueueBusy, SettingsError
from producer.rows import RejectedRow
from workers.codec import encode_blob
from workers.jsonl_io import to_jsonl
from workers.keys import RUNS_KEY, RunKeys
from workers.manifest import ENQUEUED_PREFIX, REJECTED_PREFIX, content_key
from workers.protocol import ALREADY_THERE, DUPLICATE_IN_INPUT, ORPHANED, Scripts
from workers.runs import RunSettings, decode_run_settings, differences, encode_run_settings
from workers.storage import ObjectStore

log = logging.getLogger(__name__)

Publish = Callable[[str, Sequence[str]], None]  # (run, batch ids): send each batch's message
BATCHES_PER_CHUNK = 32  # one Redis round trip per this many batches
SESSION_TTL_S = 24 * 3600
ENQUEUE_LEASE_S = 60  # renewed per chunk; a crashed enqueue blocks the next one this long at most
MS_PER_S = 1000
MAX_REJECTIONS_SHOWN = 20
CHUNKS_PUBLISHING = 4  # chunks stored but still being published, at most: memory stays flat


class StoredRejection(Record, frozen=True):
    """A rejected row as the object store keeps it: which input it came from, and where and why."""

    source: str
    rejected: RejectedRow


def rejection_key(source: str, rejected: RejectedRow) -> str:
    """The field of the run's `rejected` hash: one per row of one input."""
    return f"{source}|{rejected.file}|{rejected.row}"


@dataclass
class EnqueueReport:
    new: int = 0
    already_there: int = 0
    requeued_orphans: int = 0  # held by the run but by no batch (after `recover`): batched again
    duplicates_in_input: int = 0
    rejected: list[RejectedRow] = field(default_factory=list)
    rejected_count: int = 0
    batches: int = 0
    republished_batches: int = 0


def pin_settings(client: redis.Redis, settings: RunSettings) -> RunSettings:
    """Pin the settings at the run's first enqueue; refuse different ones later, showing the difference."""
    keys = RunKeys(settings.run)
    client.set(keys.settings, encode_run_settings(settings), nx=True)
    client.sadd(RUNS_KEY, settings.run)
    pinned = decode_run_settings(client.get(keys.settings))
    changed = differences(pinned, settings)
    if changed:
        raise SettingsError(
            f"run {settings.run!r} was started with other settings; refusing to mix them:\n  "
            + "\n  ".join(changed)
            + "\nUse the pinned values, or a new --run name."
        )
    return pinned


def republish_outbox(client: redis.Redis, run: str, publish: Publish) -> int:
    """Publish batches a crashed enqueue stored but may not have published (duplicates are harmless)."""
    keys = RunKeys(run)
    batch_ids = [raw.decode() for raw in client.smembers(keys.unpublished)]
    if not batch_ids:
        return 0
    with client.pipeline(transaction=False) as pipe:
        for batch_id in batch_ids:
            pipe.exists(keys.batch(batch_id))
        still_stored = [
            batch_id for batch_id, exists in zip(batch_ids, pipe.execute(), strict=True) if exists
        ]
    publish(run, still_stored)
    client.srem(keys.unpublished, *batch_ids)
    return len(batch_ids)


def _chunks(items: Iterable[Prompt | RejectedRow], size: int) -> Iterator[list[Prompt | RejectedRow]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


class Enqueuer:
    def __init__(
        self,
        client: redis.Redis,
        settings: RunSettings,
        publish: Publish,
        *,
        source: str,
        store: ObjectStore | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.publish = publish
        self.source = source
        self.store = store  # where the run's output goes: enqueued ids and rejected rows are kept there
        self.keys = RunKeys(settings.run)
        self.session_id = uuid.uuid4().hex
        self.session_key = self.keys.enqueue_session(self.session_id)
        self._scripts = Scripts.register(client)
        self._requeue_orphans = False

    def _hold_lease(self) -> None:
        """Take or renew the run's enqueue lease; EnqueueBusy when another enqueue holds it."""
        lease_ms = ENQUEUE_LEASE_S * MS_PER_S
        lock = self.keys.enqueue_lock
        if self.client.set(lock, self.session_id, nx=True, px=lease_ms):
            return
        if self._scripts.extend_lock(keys=[lock], args=[self.session_id, lease_ms]):
            return
        raise EnqueueBusy(
            f"another enqueue of run {self.settings.run!r} is at work; wait for it to finish "
            f"(a crashed one stops blocking within {ENQUEUE_LEASE_S} s), then run this again"
        )

    def enqueue(self, items: Iterable[Prompt | RejectedRow]) -> EnqueueReport:
        """Store and publish every new prompt. Publishing a chunk overlaps reading the next ones."""
        report = EnqueueReport()
        self._hold_lease()
        # With no batch open, nothing carries a prompt the run holds but has not finished: it was held
        # by batches Redis lost (see `recover`), and is batched again. With batches open, every such
        # prompt is in one of them.
        self._requeue_orphans = self.client.zcard(self.keys.open_batches) == 0
        report.republished_batches = republish_outbox(self.client, self.settings.run, self.publish)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="enqueue-publish") as publishing:
            in_flight: deque[Future[None]] = deque()
            try:
                for chunk in _chunks(items, self.settings.batch_size * BATCHES_PER_CHUNK):
                    self._hold_lease()
                    batch_ids = self._store_chunk(chunk, report)
                    if batch_ids:
                        in_flight.append(publishing.submit(self._publish_stored, batch_ids))
                    while in_flight and (in_flight[0].done() or len(in_flight) > CHUNKS_PUBLISHING):
                        in_flight.popleft().result()
                while in_flight:
                    in_flight.popleft().result()
            finally:
                self.client.delete(self.session_key)
                self._scripts.release_lock(keys=[self.keys.enqueue_lock], args=[self.session_id])
        return report

    def _publish_stored(self, batch_ids: list[str]) -> None:
        """Publish stored batches, then take them out of the outbox."""
        self.publish(self.settings.run, batch_ids)
        self.client.srem(self.keys.unpublished, *batch_ids)

    def _store_chunk(self, chunk: list[Prompt | RejectedRow], report: EnqueueReport) -> list[str]:
        """Write the chunk's new prompts, in batches, to Redis and the outbox; returns the batch ids."""
        prompts = [item for item in chunk if isinstance(item, Prompt)]
        self._record_rejections([item for item in chunk if isinstance(item, RejectedRow)], report)
        new = self._new_prompts(prompts, report)
        if not new:
            return []
        size = self.settings.batch_size
        batches = [
            PromptBatch(
                run=self.settings.run, batch_id=uuid.uuid4().hex[:16], prompts=new[start : start + size]
            )
            for start in range(0, len(new), size)
        ]
        ids = msgspec.json.encode([p.id for p in new])
        if self.store is not None:  # before Redis: the output never lacks an id the run holds
            self.store.put(content_key(ENQUEUED_PREFIX, ids, ".json"), ids)
        keys = [self.keys.enqueued, self.session_key, self.keys.unpublished, self.keys.open_batches]
        args: list[str | bytes | int] = [ids, SESSION_TTL_S]
        for batch in batches:
            keys.append(self.keys.batch(batch.batch_id))
            args += [encode_blob(batch), batch.batch_id]
        self._scripts.claim(keys=keys, args=args)
        report.new += len(new)
        report.batches += len(batches)
        return [batch.batch_id for batch in batches]

    def _new_prompts(self, prompts: list[Prompt], report: EnqueueReport) -> list[Prompt]:
        if not prompts:
            return []
        ids = msgspec.json.encode([p.id for p in prompts])
        keys = [self.keys.enqueued, self.session_key, self.keys.done, self.keys.staged, self.keys.dead]
        requeue = "1" if self._requeue_orphans else "0"
        statuses = self._scripts.classify(keys=keys, args=[ids, requeue]).decode()
        new: list[Prompt] = []
        seen_in_chunk: set[str] = set()
        for prompt, status in zip(prompts, statuses, strict=True):
            if status == DUPLICATE_IN_INPUT or prompt.id in seen_in_chunk:
                report.duplicates_in_input += 1
            elif status == ALREADY_THERE:
                report.already_there += 1
            elif status == ORPHANED:
                report.requeued_orphans += 1
                seen_in_chunk.add(prompt.id)
                new.append(prompt)
            else:
                seen_in_chunk.add(prompt.id)
                new.append(prompt)
        return new

    def _record_rejections(self, rejected: list[RejectedRow], report: EnqueueReport) -> None:
        if not rejected:
            return
        mapping = {rejection_key(self.source, r): msgspec.json.encode(r) for r in rejected}
        if self.store is not None:
            records = to_jsonl(StoredRejection(source=self.source, rejected=r) for r in rejected)
            self.store.put(content_key(REJECTED_PREFIX, records, ".jsonl"), records)
        self.client.hset(self.keys.rejected, mapping=mapping)
        report.rejected_count += len(rejected)
        room = MAX_REJECTIONS_SHOWN - len(report.rejected)
        report.rejected.extend(rejected[: max(room, 0)])
