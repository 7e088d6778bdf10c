"""One enqueue over several cores: this process reads and parses the input, and parts in processes of
their own (`python -m producer.enqueue.part`) classify, claim and publish it, under the one lease of the
enqueue.

Every id goes to the part its id bucket names (`id_bucket(id) % parts`), so no id is ever classified or
claimed by two parts: a part's classify-then-claim is as atomic as one enqueue's, and the same id seen
again (a duplicate, or a conflict: the first version kept) meets the same part in input order. The parts
touch disjoint id buckets and share only counters and sets every claim adds to, so the protocol's
guarantees hold part by part (producer/enqueue/enqueuer.py).

This process holds the run's enqueue lease, renews it and opens the enqueue (its number, the orphans
judgement, the outbox); parts claim under its token and stop when it is lost. Everything travels as
length-prefixed msgpack frames (plain data): the part's start down its stdin, then its chunks, at most
`PART_CHUNKS_WAITING` waiting per part so memory stays flat, then an empty frame; its outcome comes back
on its stdout. Parts run in process groups of their own, so Ctrl-C at the terminal reaches only this
process, which stops dealing; the parts finish the chunks they were handed and report: the counts are
exactly what was enqueued, as with one process.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

import msgspec

from core.records import Prompt
from core.run_settings.model import RunSettings
from intake.rejected import RejectedRow
from producer.enqueue.enqueuer import MAX_REJECTIONS_SHOWN, Enqueuer, EnqueueReport, EnqueueSession
from producer.errors import ProducerError, Unavailable
from producer.settings import PROCESSES_MIN_ROWS, default_enqueue_processes
from workers.broker.broker import BrokerOptions
from workers.state.keys import id_bucket

PART_CHUNKS_WAITING = 2  # chunks read for a part and not yet taken by it, at most
PART_POLL_S = 0.5  # how often a wait for a busy part looks whether the part failed meanwhile
PART_MODULE = "producer.enqueue.part"
FRAME_LENGTH_BYTES = 4
END_OF_INPUT = b""
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where `producer` is importable from


class PartChunk(msgspec.Struct, frozen=True):
    """One chunk of rows for a part: its prompts and the rows rejected while reading."""

    prompts: list[Prompt]
    rejected: list[RejectedRow]


class PartSpec(msgspec.Struct, frozen=True):
    """What a part process needs to reach everything itself (it shares no connection with its parent)."""

    redis_url: str
    broker: BrokerOptions
    settings: RunSettings
    source: str
    output: str | None


class PartStart(msgspec.Struct, frozen=True):
    """A part's first frame: where everything is, and the enqueue it is a part of."""

    index: int
    spec: PartSpec
    session: EnqueueSession


class PartOutcome(msgspec.Struct, frozen=True):
    """A part's last frame: its report, or the error that stopped it (a class of producer/errors.py's tree,
    by name, and its message)."""

    report: EnqueueReport | None = None
    error_type: str = ""
    error: str = ""


def write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(len(payload).to_bytes(FRAME_LENGTH_BYTES, "big") + payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame's payload; None when the stream ended (the other process is gone)."""
    header = stream.read(FRAME_LENGTH_BYTES)
    if len(header) < FRAME_LENGTH_BYTES:
        return None
    payload = stream.read(int.from_bytes(header, "big"))
    return payload if len(payload) == int.from_bytes(header, "big") else None


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
    """A part process ended without its report (killed, or out of memory), or on an unexpected error."""


def raised_in_part(outcome: PartOutcome) -> ProducerError:
    """The error a part reported, as the class of the producer's tree it named."""
    kinds: dict[str, type[ProducerError]] = {}
    pending: list[type[ProducerError]] = [ProducerError]
    while pending:
        kind = pending.pop()
        kinds[kind.__name__] = kind
        pending += kind.__subclasses__()
    return kinds.get(outcome.error_type, PartFailed)(outcome.error)


class Part:
    """A part process, its stdin its chunks go down (fed by a thread, so that Ctrl-C never cuts a frame in
    two), and its stdout its outcome comes back on."""

    def __init__(self, index: int, spec: PartSpec, session: EnqueueSession) -> None:
        self.index = index
        path = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
        self._process = subprocess.Popen(
            [sys.executable, "-m", PART_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            process_group=0,  # not the terminal's: Ctrl-C reaches the reading process alone
        )
        self._chunks_in: IO[bytes] = self._process.stdin  # type: ignore[assignment]
        self._outcome_out: IO[bytes] = self._process.stdout  # type: ignore[assignment]
        self._waiting: queue.Queue[bytes] = queue.Queue(maxsize=PART_CHUNKS_WAITING)
        self._broken = threading.Event()
        self._waiting.put(msgspec.msgpack.encode(PartStart(index=index, spec=spec, session=session)))
        self._sender = threading.Thread(
            target=self._send_waiting, name=f"enqueue-part-{index}-feed", daemon=True
        )
        self._sender.start()

    def _send_waiting(self) -> None:
        while True:
            payload = self._waiting.get()
            try:
                write_frame(self._chunks_in, payload)
            except OSError:  # the part has ended: its outcome says why
                self._broken.set()
                return
            if payload == END_OF_INPUT:
                return

    def send(self, items: list[Prompt | RejectedRow]) -> None:
        """Hand a chunk to the part, waiting while it has PART_CHUNKS_WAITING; stops waiting when the part
        has ended (its outcome, in `finish`, says why)."""
        prompts = [item for item in items if isinstance(item, Prompt)]
        rejected = [item for item in items if isinstance(item, RejectedRow)]
        self._put(msgspec.msgpack.encode(PartChunk(prompts=prompts, rejected=rejected)))

    @property
    def pid(self) -> int:
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

    def finish(self) -> EnqueueReport | ProducerError:
        """Tell the part the input ended; its report once it has enqueued every chunk it was handed, or
        what stopped it."""
        self._put(END_OF_INPUT)
        self._sender.join()
        with contextlib.suppress(OSError):  # a part that ended early left a frame half written
            self._chunks_in.close()
        payload = read_frame(self._outcome_out)
        self._outcome_out.close()
        self._process.wait()
        if payload is None:
            return PartFailed(
                f"enqueue part {self.index} ended (exit code {self._process.returncode}) before its report: "
                "what it claimed stays whole; run the same command again to add the rest"
            )
        outcome = msgspec.msgpack.decode(payload, type=PartOutcome)
        return outcome.report if outcome.report is not None else raised_in_part(outcome)


def received_chunks(stream: IO[bytes]) -> Iterator[list[Prompt | RejectedRow]]:
    """The chunks the reading process hands over, until the end of the input, or until that process is
    gone (then the lease it held runs out, and the claims with it)."""
    decoder = msgspec.msgpack.Decoder(PartChunk)
    while (payload := read_frame(stream)) not in (None, END_OF_INPUT):
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
    parts: int,
    *,
    redis_url: str,
    broker: BrokerOptions,
    start_part: Callable[[int, PartSpec, EnqueueSession], Part] = Part,
) -> EnqueueReport:
    """Enqueue `items` as `enqueuer`'s enqueue, in `parts` processes (see the module docstring), each
    reaching Redis at `redis_url` and the broker with `broker`. Raises what a part raised (the first), once
    every part has stopped."""
    output = enqueuer.store.url if enqueuer.store is not None else None
    spec = PartSpec(
        redis_url=redis_url,
        broker=broker,
        settings=enqueuer.settings,
        source=enqueuer.source,
        output=output,
    )
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
        if isinstance(outcome, ProducerError):
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
