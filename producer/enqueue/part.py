"""`python -m producer.enqueue.part`: one part of an enqueue in processes (producer/enqueue/processes.py).

Reads its start, then chunks, as msgpack frames on stdin until an empty frame (or until the reading process
is gone); enqueues them as a part of that enqueue; writes its outcome as one frame on stdout: its report,
or the error that stopped it as a class of the producer's error tree. Anything printed goes to stderr, so
that stdout carries the outcome alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback

import msgspec

from producer.enqueue.enqueuer import Enqueuer
from producer.enqueue.processes import (
    PartFailed,
    PartOutcome,
    PartStart,
    read_frame,
    received_chunks,
    write_frame,
)
from producer.enqueue.publisher import BatchPublisher
from producer.errors import ProducerError, as_producer_error, lower_errors
from workers.broker.broker import sending_app
from workers.record.storage import open_store
from workers.state.redis_client import client_for

STDOUT_FD, STDERR_FD = 1, 2


def enqueue_part(start: PartStart) -> PartOutcome:
    """Enqueue the chunks that come on stdin as a part of `start.session`; the report, or what stopped it."""
    spec = start.spec
    publisher = BatchPublisher(sending_app(spec.broker))
    try:
        store = open_store(spec.output) if spec.output else None
        client = client_for(spec.redis_url)
        enqueuer = Enqueuer(client, spec.settings, publisher, source=spec.source, store=store)
        return PartOutcome(report=enqueuer.enqueue_part(start.session, received_chunks(sys.stdin.buffer)))
    except ProducerError as error:
        return _failed(error)
    except lower_errors() as error:
        return _failed(as_producer_error(error, redis_url=spec.redis_url))
    except Exception as error:  # a defect: its traceback goes to stderr, the reading process says one line
        traceback.print_exc()
        return _failed(PartFailed(f"enqueue part {start.index} failed: {type(error).__name__}: {error}"))
    finally:
        publisher.close()


def _failed(error: ProducerError) -> PartOutcome:
    return PartOutcome(error_type=type(error).__name__, error=str(error))


def main() -> int:
    outcome_out = os.fdopen(os.dup(STDOUT_FD), "wb")
    os.dup2(STDERR_FD, STDOUT_FD)  # whatever prints, prints to stderr
    logging.basicConfig(level=logging.WARNING)
    first = read_frame(sys.stdin.buffer)
    if first is None:  # the reading process is gone before it said what to do
        return 0
    outcome = enqueue_part(msgspec.msgpack.decode(first, type=PartStart))
    with contextlib.suppress(OSError):  # the reading process is gone: there is nobody to tell
        write_frame(outcome_out, msgspec.msgpack.encode(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main())
