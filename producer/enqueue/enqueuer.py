"""Enqueue a stream of prompts into a run: only what is new, batched, compressed, and never lost.

Each chunk's new ids are first written to the object store (`enqueued/`, so the output alone says
what the run was asked to do), then, in one atomic Redis step, join the run's ids (each with the enqueue
that claimed it: how a duplicate in the input is told from an id already there) together with the
batches that carry them and the outbox entry of each batch. Only then are the batch messages
published, and each batch leaves the outbox once published. A crash anywhere leaves either nothing or
batches in the outbox, which the next `enqueue` publishes first. A chunk's new prompts are batched longest
expected work first, each batch at most `batch_size` requests (a conversation counts its turns), its id
naming its class, the priority its message goes with (producer/enqueue/work_order.py). Rejected rows go to the
object store too (`rejected/`). One enqueue of a run works at a time (a lease in Redis), so a prompt is
never placed in two batches by two enqueues racing.

An id seen again is a duplicate when its content is the same, and a conflict when it differs: the
first version is kept, and the later row is rejected naming the row (or the earlier enqueue) that
holds the kept one. Explicit ids keep a short content digest for that, in Redis and beside the chunk's
ids in the output (producer/enqueue/fingerprints.py).

Ctrl-C stops at a chunk boundary: a chunk's store-and-claim step runs on a thread of its own, which
SIGINT never reaches, and the chunks already stored finish publishing, so the run holds whole batches
only and the report counts exactly what was enqueued; running the same command again adds only the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice

import msgspec
import redis

from core.records import Prompt, PromptBatch
from core.run_settings.model import RunSettings, differences
from intake.rejected import RejectedRow
from intake.rows import rejection_key
from producer.enqueue.file_numbers import FileNumbers
from producer.enqueue.fingerprints import Fingerprint, content_digest
from producer.enqueue.work_order import RunLengths, WorkPredictor, batched_by_turns
from producer.errors import EnqueueBusy, SettingsError
from workers.periodic import PeriodicThread
from workers.record.enqueued import EnqueuedChunk, EnqueueNote
from workers.record.jsonl_io import to_jsonl
from workers.record.manifest import ENQUEUED_PREFIX, REJECTED_PREFIX, content_key
from workers.record.object_store import ObjectStore
from workers.record.rejections import StoredRejection
from workers.state.batch_priority import classed_batch_id
from workers.state.codec import encode_blob
from workers.state.keys import RUNS_KEY, RunKeys
from workers.state.protocol import ALREADY_THERE, DUPLICATE_IN_INPUT, LOCK_LOST, NEW, ORPHANED, Scripts
from workers.state.runs import decode_run_settings, encode_run_settings
from workers.state.stats_fields import COMPLETION_TOKENS, COMPLETIONS, TURNS, generated_turns, parse_counters

log = logging.getLogger(__name__)

Publish = Callable[[str, Sequence[str]], None]  # (run, batch ids): send each batch's message
BATCHES_PER_CHUNK = 32  # one Redis round trip per this many batches
BATCH_ID_BITS = 64
BITS_PER_HEX_DIGIT = 4
ENQUEUE_LEASE_S = 60  # a crashed enqueue blocks the next one this long at most
ENQUEUE_RENEW_S = 20.0  # renewed this often while the enqueue lives, however long a chunk's writes take
MS_PER_S = 1000
MAX_REJECTIONS_SHOWN = 20
CHUNKS_PUBLISHING = 4  # chunks stored but still being published, at most: memory stays flat
CHUNKS_STORING = 1  # chunks read and waiting for the store thread, at most, beside the one it stores


@dataclass(frozen=True)
class EnqueueSession:
    """One enqueue as its processes share it: the token of the run's enqueue lease it holds, its number
    among the run's enqueues and its note, and whether it batches again what the run holds but no batch
    carries (judged once, when it opened)."""

    token: str
    number: int
    note: EnqueueNote
    requeue_orphans: bool


@dataclass
class EnqueueReport:
    new: int = 0
    already_there: int = 0
    requeued_orphans: int = 0  # held by the run but by no batch (after `recover`): batched again
    requeued_changed: int = 0  # of those, rows whose content differs from the first enqueue's (now lost)
    duplicates_in_input: int = 0  # the same id with the same content as an earlier row
    rejected: list[RejectedRow] = field(default_factory=list)  # the first MAX_REJECTIONS_SHOWN
    rejected_count: int = 0
    conflicts: list[RejectedRow] = field(default_factory=list)  # same id, other content: the first shown
    conflict_count: int = 0
    batches: int = 0
    republished_batches: int = 0
    interrupted: bool = False  # Ctrl-C: the counts are exactly what was enqueued before it


def check_same_settings(pinned: RunSettings, given: RunSettings) -> None:
    """Refuse settings that differ from the pinned ones, showing each difference."""
    changed = differences(pinned, given)
    if changed:
        raise SettingsError(
            f"run {given.run!r} was started with other settings; refusing to mix them:\n  "
            + "\n  ".join(changed)
            + "\nUse the pinned values, or a new --run name."
        )


def pin_settings(client: redis.Redis, settings: RunSettings) -> RunSettings:
    """Pin the settings at the run's first enqueue; refuse different ones later, showing the difference."""
    keys = RunKeys(settings.run)
    client.set(keys.settings, encode_run_settings(settings), nx=True)
    client.sadd(RUNS_KEY, settings.run)
    pinned = decode_run_settings(client.get(keys.settings))
    check_same_settings(pinned, settings)
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
        # Batch ids: 64 random bits each, from a generator seeded from the OS once (asking the OS for each
        # of a run's hundreds of thousands of batches cost a second per 6,000 on a cloud VM).
        self._batch_ids = random.Random(uuid.uuid4().int)
        self._scripts = Scripts.register(client)
        self._files = FileNumbers(client, self.keys, self._scripts)
        # its lease's token; its number and note once `open` (what another process needs to enqueue a part
        # of this input as this enqueue)
        self.session = EnqueueSession(
            token=uuid.uuid4().hex, number=0, note=EnqueueNote(source=source, at=0.0), requeue_orphans=False
        )
        self._notes: dict[int, str] = {}
        self._work = WorkPredictor()  # used on the store thread only

    def _new_batch_id(self, prompts: Sequence[Prompt]) -> str:
        """A new batch's id, naming the class of its longest prompt's work (the first: longest first)."""
        unique = f"{self._batch_ids.getrandbits(BATCH_ID_BITS):0{BATCH_ID_BITS // BITS_PER_HEX_DIGIT}x}"
        return classed_batch_id(self._work.priority(prompts[0]), unique)

    def _run_lengths(self) -> RunLengths:
        """What the run's completions so far show (none before its first), to order what comes next."""
        fields = (TURNS, COMPLETIONS, COMPLETION_TOKENS)
        values = self.client.hmget(self.keys.stats, fields)
        counters = parse_counters(
            {name.encode(): value for name, value in zip(fields, values, strict=True) if value is not None}
        )
        tokens = counters.get(COMPLETION_TOKENS, 0)
        return RunLengths(turns=generated_turns(counters), completion_tokens=tokens)

    def take_lease(self) -> None:
        """Take the run's enqueue lease; EnqueueBusy when another enqueue holds it."""
        if self.client.set(
            self.keys.enqueue_lock, self.session.token, nx=True, px=ENQUEUE_LEASE_S * MS_PER_S
        ):
            return
        raise EnqueueBusy(
            f"another enqueue of run {self.settings.run!r} is at work; wait for it to finish "
            f"(a crashed one stops blocking within {ENQUEUE_LEASE_S} s), then run this again"
        )

    def _renew_lease(self) -> bool:
        """Keep the lease while a chunk's writes take long (a slow object store). True while it is ours."""
        return bool(
            self._scripts.extend_lock(
                keys=[self.keys.enqueue_lock], args=[self.session.token, ENQUEUE_LEASE_S * MS_PER_S]
            )
        )

    def _keep_lease(self, prompts: int) -> None:
        """Before a chunk: the lease must have been ours all along. One that ran out is never taken
        again, even when free: another enqueue may have held it meanwhile, and what this one judged
        at its start (which prompts no batch carries) may no longer hold."""
        if not self._renew_lease():
            raise self._lease_lost(prompts)

    def _lease_lost(self, prompts: int) -> EnqueueBusy:
        return EnqueueBusy(
            f"this enqueue of run {self.settings.run!r} lost its lease while it waited (another "
            f"enqueue may have taken over); it stopped before claiming {prompts} prompts, and "
            "what it enqueued before stays: run the same command again to add the rest"
        )

    def enqueue(self, items: Iterable[Prompt | RejectedRow]) -> EnqueueReport:
        """Store and publish every new prompt. Publishing a chunk overlaps reading the next ones.
        Ctrl-C ends it at a chunk boundary with `report.interrupted` set (see the module docstring).
        Raises EnqueueBusy when another enqueue of the run holds its lease, or took it over."""
        report = EnqueueReport()
        with self.holding_lease():
            try:
                report.republished_batches = self.open()
                self._enqueue_chunks(_chunks(items, self.chunk_rows), report)
            except KeyboardInterrupt:
                report.interrupted = True
        return report

    @property
    def chunk_rows(self) -> int:
        """Rows per chunk: one Redis round trip each to classify and to claim."""
        return self.settings.batch_size * BATCHES_PER_CHUNK

    @contextlib.contextmanager
    def holding_lease(self) -> Iterator[None]:
        """Hold the run's enqueue lease, renewed, until the block ends; EnqueueBusy when another enqueue
        holds it."""
        self.take_lease()
        renewer = PeriodicThread("draftgen-enqueue-lease", ENQUEUE_RENEW_S, self._renew_lease)
        renewer.start()
        try:
            yield
        finally:
            renewer.stop()
            self.release_lease()

    def release_lease(self) -> None:
        """Give the lease up, if it is still this enqueue's."""
        self._scripts.release_lock(keys=[self.keys.enqueue_lock], args=[self.session.token])

    def open(self) -> int:
        """Under the lease: note this enqueue in the run (its number), judge whether prompts the run holds
        but no batch carries are batched again, and publish what a crashed enqueue left in the outbox
        (returns how many batches)."""
        # With no batch open and no finished batch's body kept, nothing carries a prompt the run holds but
        # has not finished: it was held by batches Redis lost (see `recover`), and is batched again. With
        # batches open, every such prompt is in one of them; a kept body is one the uploader re-opens
        # when a record of its prompts is quarantined, at any moment of this enqueue. Neither can appear
        # meanwhile: batches are made only by an enqueue, under this lease.
        requeue_orphans = not any(
            self.client.zcard(key) for key in (self.keys.open_batches, self.keys.finished_batches)
        )
        republished = republish_outbox(self.client, self.settings.run, self.publish)
        note = EnqueueNote(source=self.source, at=time.time())
        number = int(self.client.rpush(self.keys.enqueues, msgspec.json.encode(note)))
        self.session = dataclasses.replace(
            self.session, number=number, note=note, requeue_orphans=requeue_orphans
        )
        return republished

    def enqueue_part(
        self, session: EnqueueSession, chunks: Iterable[list[Prompt | RejectedRow]]
    ) -> EnqueueReport:
        """Enqueue chunks of an input as part of the enqueue `session` opened (in another process, which
        holds its lease): every id of the input that this part holds must come to it alone, so that no
        other part classifies or claims it meanwhile (producer/enqueue/processes.py)."""
        self.session = session
        report = EnqueueReport()
        self._enqueue_chunks(chunks, report)
        return report

    def _enqueue_chunks(self, chunks: Iterable[list[Prompt | RejectedRow]], report: EnqueueReport) -> None:
        """Chunks are stored one after the other, in order, on a thread of their own while the next chunk is
        read (waiting for Redis overlaps parsing), and each is published as soon as it is stored, while
        both go on. On Ctrl-C, the chunk being stored finishes, and so do the chunks' publishing."""
        with (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="enqueue-store") as storing,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="enqueue-publish") as publishing,
        ):
            stored: deque[Future[Future[None] | None]] = deque()
            published: deque[Future[None]] = deque()

            def settle(wait: bool) -> None:
                while stored and (wait or stored[0].done() or len(stored) > CHUNKS_STORING):
                    if (publication := stored.popleft().result()) is not None:
                        published.append(publication)
                while published and (wait or published[0].done() or len(published) > CHUNKS_PUBLISHING):
                    published.popleft().result()

            try:
                for chunk in chunks:
                    stored.append(storing.submit(self._store_then_publish, chunk, report, publishing))
                    settle(wait=False)
            finally:
                settle(wait=True)  # a chunk handed to the store thread is stored whole, or not at all

    def _store_then_publish(
        self, chunk: list[Prompt | RejectedRow], report: EnqueueReport, publishing: ThreadPoolExecutor
    ) -> Future[None] | None:
        batch_ids = self._store_chunk(chunk, report)
        return publishing.submit(self._publish_stored, batch_ids) if batch_ids else None

    def _publish_stored(self, batch_ids: list[str]) -> None:
        """Publish stored batches, then take them out of the outbox."""
        self.publish(self.settings.run, batch_ids)
        self.client.srem(self.keys.unpublished, *batch_ids)

    def _store_chunk(self, chunk: list[Prompt | RejectedRow], report: EnqueueReport) -> list[str]:
        """Write the chunk's new prompts, in batches, to Redis and the outbox; returns the batch ids. On
        the store thread: Ctrl-C reaches the main thread only, so a chunk is claimed whole or not at all."""
        prompts = [item for item in chunk if isinstance(item, Prompt)]
        self._keep_lease(len(prompts))
        fingerprinted, conflicts = self._new_prompts(prompts, report)
        self._record_rejections([item for item in chunk if isinstance(item, RejectedRow)], conflicts, report)
        if not fingerprinted:
            return []
        self._work.learn(self._run_lengths())
        self._work.observe(prompts)
        fingerprinted = self._work.longest_first(fingerprinted, lambda pair: pair[0])
        new = [prompt for prompt, _ in fingerprinted]
        fingerprints = {prompt.id: found.encode() for prompt, found in fingerprinted if found is not None}
        batched = batched_by_turns(new, self.settings.batch_size)
        batches = [
            PromptBatch(run=self.settings.run, batch_id=self._new_batch_id(members), prompts=members)
            for members in batched
        ]
        ids = msgspec.json.encode([p.id for p in new])
        if self.store is not None:  # before Redis: the output never lacks an id the run holds
            record = EnqueuedChunk(
                ids=[p.id for p in new],
                enqueue_number=self.session.number,
                note=self.session.note,
                fingerprints=fingerprints,
            )
            self.store.put(content_key(ENQUEUED_PREFIX, ids, ".json"), msgspec.json.encode(record))
        explicit = [found for _, found in fingerprinted if found is not None]
        numbered = iter(self._files.holders(explicit))
        hashed = str(self.session.number)  # a hashed id's holder: the id is its content's digest
        holders = [hashed if found is None else next(numbered) for _, found in fingerprinted]
        keys = [
            self.keys.enqueued_count,
            self.keys.unpublished,
            self.keys.open_batches,
            self.keys.enqueue_lock,
            *(self.keys.ids(p.id) for p in new),
        ]
        lease_ms = ENQUEUE_LEASE_S * MS_PER_S
        args: list[str | bytes | int] = [self.session.token, lease_ms, ids, msgspec.json.encode(holders)]
        for batch in batches:
            keys.append(self.keys.batch(batch.batch_id))
            args += [encode_blob(batch), batch.batch_id]
        try:
            self._scripts.claim(keys=keys, args=args)
        except redis.ResponseError as error:
            if LOCK_LOST not in str(error):
                raise
            raise self._lease_lost(len(new)) from error
        report.new += len(new)
        report.batches += len(batches)
        return [batch.batch_id for batch in batches]

    def _new_prompts(
        self, prompts: list[Prompt], report: EnqueueReport
    ) -> tuple[list[tuple[Prompt, Fingerprint | None]], list[RejectedRow]]:
        """The prompts to batch, each with its fingerprint (None for a hashed id), and the rows whose id
        the run (or this input) holds with other content."""
        if not prompts:
            return [], []
        ids = msgspec.json.encode([p.id for p in prompts])
        keys = [self.keys.done, self.keys.staged, self.keys.dead, *(self.keys.ids(p.id) for p in prompts)]
        requeue = "1" if self.session.requeue_orphans else "0"
        statuses_raw, *holders = self._scripts.classify(keys=keys, args=[ids, requeue, self.session.number])
        statuses = statuses_raw.decode()
        digests = [content_digest(p) for p in prompts]  # None for a hashed id: the id is the digest
        held = iter(holders)  # one for each id the run holds, in order
        new: list[tuple[Prompt, Fingerprint | None]] = []
        conflicts: list[RejectedRow] = []
        in_chunk: dict[str, Fingerprint | None] = {}
        for prompt, status, digest in zip(prompts, statuses, digests, strict=True):
            holder = None if status == NEW else next(held)
            first = Fingerprint.decode(holder) if digest is not None else None
            kept = None if status == ORPHANED else first  # an orphan's first text went with its batch
            earlier = in_chunk.get(prompt.id, kept)
            if earlier is not None and earlier.digest != digest:
                conflicts.append(self._conflict(prompt, earlier))
            elif status == DUPLICATE_IN_INPUT or prompt.id in in_chunk:
                report.duplicates_in_input += 1
            elif status == ALREADY_THERE:
                report.already_there += 1
            else:
                if status == ORPHANED:
                    report.requeued_orphans += 1
                    report.requeued_changed += first is not None and first.digest != digest
                fingerprint = None if digest is None else self._fingerprint(prompt, digest)
                in_chunk[prompt.id] = fingerprint
                new.append((prompt, fingerprint))
        return new, conflicts

    def _fingerprint(self, prompt: Prompt, digest: str) -> Fingerprint:
        return Fingerprint(
            digest=digest, enqueue_number=self.session.number, row=prompt.row, file=prompt.file
        )

    def _conflict(self, prompt: Prompt, held: Fingerprint) -> RejectedRow:
        earlier = self._files.named(held)
        if earlier.enqueue_number == self.session.number:
            where, kept = f"{earlier.place()} of this input", f"{earlier.place()}'s version"
        else:
            where = f"{earlier.place()} of {self._note(earlier.enqueue_number)}"
            kept = "the version enqueued then"
        return RejectedRow(
            row=prompt.row,
            file=prompt.file,
            reason=f"id {prompt.id!r} conflicts with {where}: same id, other content; kept {kept}, "
            "dropped this row",
        )

    def _note(self, number: int) -> str:
        if number not in self._notes:
            # LRANGE, not LINDEX: the producer's Redis user (deploy/redis-users.acl) may run only LRANGE
            found = self.client.lrange(self.keys.enqueues, number - 1, number - 1)
            note = msgspec.json.decode(found[0], type=EnqueueNote) if found else None
            self._notes[number] = note.describe(number) if note else f"enqueue {number}"
        return self._notes[number]

    def _record_rejections(
        self, rejected: list[RejectedRow], conflicts: list[RejectedRow], report: EnqueueReport
    ) -> None:
        """Keep refused rows (unparsable ones and conflicts) in Redis and the object store, for `rejects`."""
        refused = rejected + conflicts
        if not refused:
            return
        mapping = {rejection_key(self.source, r): msgspec.json.encode(r) for r in refused}
        if self.store is not None:
            records = to_jsonl(StoredRejection(source=self.source, rejected=r) for r in refused)
            self.store.put(content_key(REJECTED_PREFIX, records, ".jsonl"), records)
        self.client.hset(self.keys.rejected, mapping=mapping)
        report.rejected_count += len(rejected)
        report.rejected.extend(rejected[: max(MAX_REJECTIONS_SHOWN - len(report.rejected), 0)])
        report.conflict_count += len(conflicts)
        report.conflicts.extend(conflicts[: max(MAX_REJECTIONS_SHOWN - len(report.conflicts), 0)])
