"""One enqueue over several cores: this process reads and parses the input, and parts in processes of
their own classify, claim and publish it, under the one lease of the enqueue.

Every id goes to the part its id bucket names (`id_bucket(id) % parts`), so no id is ever classified or
claimed by two parts: a part's classify-then-claim is as atomic as one enqueue's, and the same id seen
again (a duplicate, or a conflict: the first version kept) meets the same part in input order. The parts
touch disjoint id buckets and share only counters and sets every claim adds to, so the protocol's
guarantees hold part by part (producer/enqueue.py).

This process holds the run's enqueue lease, renews it and opens the enqueue (its number, the orphans
judgement, the outbox); parts claim under its token and stop when it is lost. Chunks travel as msgpack
over a pipe, at most `PART_CHUNKS_WAITING` waiting per part, so memory stays flat. Ctrl-C reaches every
process of the terminal; parts ignore it, finish the chunks they were handed, and report: the counts are
exactly what was enqueued, as with one process.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import pickle
import queue
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Final

import msgspec
import redis

from inference.records import Prompt
from intake.rejected import RejectedRow
from producer.enqueue import MAX_REJECTIONS_SHOWN, Enqueuer, EnqueueReport, EnqueueSession
from producer.errors import Unavailable
from producer.settings import PROCESSES_MIN_ROWS, default_enqueue_processes
from workers.state.broker import BrokerOptions
from workers.state.keys import id_bucket
from workers.state.runs import RunSettings

PART_CHUNKS_WAITING = 2  # chunks read for a part and not yet taken by it, at most
PART_POLL_S = 0.5  # how often a wait for a busy part looks whether the part failed meanwhile
SPAWN: Final = "spawn"  # not fork: the reading process has threads (the lease's renewer, Arrow's)
END_OF_INPUT = b""


class PartChunk(msgspec.Struct, frozen=True):
    """One chunk of rows for a part: its prompts and the rows rejected while reading."""

    prompts: list[Prompt]
    rejected: list[RejectedRow]


@dataclass(frozen=True)
class PartSpec:
    """What a part process needs to reach everything itself (it shares no connection with its parent)."""

    redis_url: str
    broker: BrokerOptions
    settings: RunSettings
    source: str
    output_url: str | None


def parts_for(
    items: Iterator[Prompt | RejectedRow], parts: int | None
) -> tuple[Iterator[Prompt | RejectedRow], int]:
    """How many parts to enqueue `items` in: `parts` when given; else one per core (at most
    MAX_ENQUEUE_PROCESSES) when the input holds over PROCESSES_MIN_ROWS rows, which are read ahead to
    tell, or one. Returns the same rows with it."""
    if parts is not None:
        return items, parts
    ahead = list(itertools.islice(items, PROCESSES_MIN_ROWS + 1))
    chosen = default_enqueue_processes() if len(ahead) > PROCESSES_MIN_ROWS else 1
    return itertools.chain(ahead, items), chosen


def part_of(item: Prompt | RejectedRow, parts: int) -> int:
    """The part an input row goes to: a prompt's by its id bucket, a rejected row's by its row."""
    return id_bucket(item.id) % parts if isinstance(item, Prompt) else item.row % parts


class PartFailed(Unavailable):
    """A part process ended without its report (killed, or out of memory)."""


class Part:
    """A part process, the pipe its chunks go down (fed by a thread, so that Ctrl-C never cuts a chunk in
    two), and the pipe its report comes back on."""

    def __init__(self, index: int, spec: PartSpec, session: EnqueueSession) -> None:
        context = multiprocessing.get_context(SPAWN)
        chunks_out, self._chunks_in = context.Pipe(duplex=False)
        self._results_in, results_out = context.Pipe(duplex=False)
        self.index = index
        self._process: BaseProcess = context.Process(
            target=run_part,
            args=(spec, session, chunks_out, results_out),
            name=f"draftgen-enqueue-part-{index}",
            daemon=True,
        )
        with _ctrl_c_ignored():  # inherited: a part starting up is never stopped by Ctrl-C halfway
            self._process.start()
        chunks_out.close()  # the part's copies: once it exits, writing fails instead of blocking
        results_out.close()
        self._waiting: queue.Queue[bytes] = queue.Queue(maxsize=PART_CHUNKS_WAITING)
        self._broken = threading.Event()
        self._sender = threading.Thread(
            target=self._send_waiting, name=f"{self._process.name}-feed", daemon=True
        )
        self._sender.start()

    def _send_waiting(self) -> None:
        while True:
            payload = self._waiting.get()
            try:
                self._chunks_in.send_bytes(payload)
            except OSError:  # the part has ended: its report says why
                self._broken.set()
                return
            if payload == END_OF_INPUT:
                return

    def send(self, items: list[Prompt | RejectedRow]) -> None:
        """Hand a chunk to the part, waiting while it has PART_CHUNKS_WAITING; stops waiting when the part
        has ended (its report, in `finish`, says why)."""
        prompts = [item for item in items if isinstance(item, Prompt)]
        rejected = [item for item in items if isinstance(item, RejectedRow)]
        self._put(msgspec.msgpack.encode(PartChunk(prompts=prompts, rejected=rejected)))

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def broken(self) -> bool:
        return self._broken.is_set()

    def _put(self, payload: bytes) -> None:
        while not self._broken.is_set():
            try:
                self._waiting.put(payload, timeout=PART_POLL_S)
                return
            except queue.Full:
                continue

    def finish(self) -> EnqueueReport | BaseException:
        """Tell the part the input ended; its report once it has enqueued every chunk it was handed, or
        what stopped it."""
        self._put(END_OF_INPUT)
        self._sender.join()
        try:
            outcome: EnqueueReport | BaseException = self._results_in.recv()
        except EOFError:
            self._process.join()
            return PartFailed(
                f"enqueue part {self.index} ended (exit code {self._process.exitcode}) before its report: "
                "what it claimed stays whole; run the same command again to add the rest"
            )
        self._process.join()
        return outcome


@contextlib.contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored meanwhile: a process started now keeps ignoring it (Python leaves an ignored SIGINT
    ignored), so Ctrl-C, which reaches every process of the terminal, stops only the reading process, which
    decides where the enqueue stops."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_part(spec: PartSpec, session: EnqueueSession, chunks: Connection, results: Connection) -> None:
    """A part process: enqueue every chunk that comes down `chunks`, then send the report (or the error)."""
    from producer.publisher import BatchPublisher
    from workers.record.storage import open_store
    from workers.state.broker import sending_app

    publisher = BatchPublisher(sending_app(spec.broker))
    outcome: EnqueueReport | BaseException
    try:
        store = open_store(spec.output_url) if spec.output_url else None
        enqueuer = Enqueuer(
            redis.Redis.from_url(spec.redis_url), spec.settings, publisher, source=spec.source, store=store
        )
        outcome = enqueuer.enqueue_part(session, received_chunks(chunks))
    except Exception as error:  # sent whole to the reading process, which maps it as its own
        outcome = error
    finally:
        publisher.close()
    with contextlib.suppress(OSError):  # the reading process is gone: there is nobody to tell
        try:
            results.send(outcome)
        except (pickle.PicklingError, TypeError, AttributeError) as unpicklable:
            results.send(PartFailed(f"enqueue part failed: {outcome} ({unpicklable})"))


def received_chunks(chunks: Connection) -> Iterator[list[Prompt | RejectedRow]]:
    """The chunks the reading process hands over, until the end of the input, or until that process is
    gone (then the lease it held runs out, and the claims with it)."""
    decoder = msgspec.msgpack.Decoder(PartChunk)
    with contextlib.suppress(EOFError):
        while (payload := chunks.recv_bytes()) != END_OF_INPUT:
            chunk = decoder.decode(payload)
            yield [*chunk.rejected, *chunk.prompts]


def merged(reports: Iterable[EnqueueReport]) -> EnqueueReport:
    """The parts' reports as one: counts added, the rows shown the first in the input (each part shows its
    first MAX_REJECTIONS_SHOWN, so the input's first are among them)."""
    total = EnqueueReport()
    for report in reports:
        total.new += report.new
        total.already_there += report.already_there
        total.requeued_orphans += report.requeued_orphans
        total.requeued_changed += report.requeued_changed
        total.duplicates_in_input += report.duplicates_in_input
        total.rejected_count += report.rejected_count
        total.conflict_count += report.conflict_count
        total.batches += report.batches
        total.rejected += report.rejected
        total.conflicts += report.conflicts
    total.rejected = sorted(total.rejected, key=_place)[:MAX_REJECTIONS_SHOWN]
    total.conflicts = sorted(total.conflicts, key=_place)[:MAX_REJECTIONS_SHOWN]
    return total


def _place(row: RejectedRow) -> tuple[str, int]:
    return row.file, row.row


def enqueue_in_parts(
    enqueuer: Enqueuer,
    items: Iterable[Prompt | RejectedRow],
    spec: PartSpec,
    parts: int,
    *,
    start_part: Callable[[int, PartSpec, EnqueueSession], Part] = Part,
) -> EnqueueReport:
    """Enqueue `items` as `enqueuer`'s enqueue, in `parts` processes (see the module docstring). Raises
    what a part raised (the first), once every part has stopped."""
    with enqueuer.holding_lease():
        interrupted = False
        try:
            republished = enqueuer.open()
        except KeyboardInterrupt:
            return EnqueueReport(interrupted=True)
        started: list[Part] = []
        try:
            started += (start_part(index, spec, enqueuer.session) for index in range(parts))
            _route(items, started, enqueuer.chunk_rows)
        except KeyboardInterrupt:
            interrupted = True
        finally:  # also when reading fails part-way: what the parts were handed is enqueued whole
            outcomes = [part.finish() for part in started]
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    report = merged(outcome for outcome in outcomes if isinstance(outcome, EnqueueReport))
    report.republished_batches = republished
    report.interrupted = interrupted
    return report


def _route(items: Iterable[Prompt | RejectedRow], parts: list[Part], chunk_rows: int) -> None:
    """Hand the input's chunks to their parts; stops early when a part has ended."""
    for index, chunk in dealt(items, len(parts), chunk_rows):
        parts[index].send(chunk)
        if any(part.broken for part in parts):
            return


def dealt(
    items: Iterable[Prompt | RejectedRow], parts: int, chunk_rows: int
) -> Iterator[tuple[int, list[Prompt | RejectedRow]]]:
    """The input's rows dealt to `parts` parts (`part_of`): each chunk of `chunk_rows` rows with its part,
    as soon as it is full, then each part's last one."""
    pending: list[list[Prompt | RejectedRow]] = [[] for _ in range(parts)]
    for item in items:
        index = part_of(item, parts)
        pending[index].append(item)
        if len(pending[index]) >= chunk_rows:
            yield index, pending[index]
            pending[index] = []
    for index, rest in enumerate(pending):
        if rest:
            yield index, rest
