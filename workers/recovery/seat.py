"""A generate worker's seat: one live process per GPU, and a restarted worker takes its batches back at once.

A worker's identity is its GPU label (`host/gpuN`, or `host/<server URL>`), the one `status` shows.
A process holds the label's seat by subscribing to a channel of its own, `draftgen:seat:<label>:<token>`,
on a connection kept for its whole life, and by writing its token in `draftgen:seats:<label>`. Redis
drops a subscription the moment its connection closes, and the kernel closes every socket of a process
that ends, SIGKILL and OOM kill included. So a seat whose channel has no subscriber belongs to no live
process: taking the seat checks that and writes the token in one transaction that watches the seat (a
seat taken by another meanwhile makes it look again). Plain commands, not a Redis function, so a worker
takes its seat before anything has loaded the protocol's functions (a fleet started before its first
enqueue).

Why that is safe: the only processes whose leases a new seat holder takes back are those that held the
same label and whose connection Redis has closed: they are gone and send nothing more. A live process
always looks alive, even frozen (SIGSTOP) or behind a partition, because its connection stays open;
then the newcomer is refused (two workers started on one GPU by mistake, or two hosts with the same
name) and says so, and the old process's leases expire as any do. A host that vanished without closing
its sockets also still looks alive until Redis's TCP keepalive ends the connection: its successor is
refused meanwhile, and other GPUs take its batches once their leases expire, as always.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis
from redis.client import Pipeline, PubSub

from workers.errors import SeatHeld, SeatRefused
from workers.periodic import PeriodicThread
from workers.state.keys import seat_channel, seat_channel_prefix, seat_key

log = logging.getLogger(__name__)

SEAT_CHECK_S = 2.0  # how often the holder reads its subscription (re-subscribing after a Redis restart)
# How long taking a seat waits for Redis's answer to SUBSCRIBE (milliseconds, normally): a refusal read
# later would let the seat look held by its live holder, and the worker say the wrong reason.
SUBSCRIBE_ANSWER_S = 5.0


def stop_this_process(reason: str) -> None:
    """A seat lost: stop as SIGTERM stops a worker (its batches go back), saying why."""
    log.error("%s", reason)
    os.kill(os.getpid(), signal.SIGTERM)


@dataclass(frozen=True)
class TakenSeat:
    token: str
    previous: str  # the token of the process that held the seat before, '' when none did


class Seat:
    """The seat of one worker process. `take` once at start; `release` on shutdown."""

    def __init__(
        self, client: redis.Redis, label: str, *, on_lost: Callable[[str], None], token: str | None = None
    ) -> None:
        self._client = client
        self.label = label
        self.token = token or uuid.uuid4().hex
        self._on_lost = on_lost
        self._pubsub: PubSub | None = None
        self._lock = threading.Lock()
        self._lost = False
        self._taken = False
        self._keeper = PeriodicThread("draftgen-seat", SEAT_CHECK_S, self.check)

    def take(self) -> TakenSeat:
        """Hold the seat, or raise SeatHeld when a live process holds it, SeatRefused when this
        process's Redis user may not hold it."""
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            self._pubsub.subscribe(seat_channel(self.label, self.token))
            self._pubsub.get_message(timeout=SUBSCRIBE_ANSWER_S)  # its confirmation, or its refusal
            watched = seat_key(self.label)
            taken, holder = self._client.transaction(self._take, watched, value_from_callable=True)
        except redis.exceptions.NoPermissionError as error:
            self._close_subscription()
            raise SeatRefused(f"Redis refused the seat of {self.label} (NOPERM: {error})") from error
        if not taken:
            self._close_subscription()
            raise SeatHeld(
                f"another live worker holds {self.label} (its seat {holder[:8]}): one generate "
                "worker per GPU; stop the other one, or give this one another DRAFTGEN_GPU or "
                "DRAFTGEN_HOSTNAME (two hosts with the same name share labels)"
            )
        self._taken = True
        self._keeper.start()
        return TakenSeat(self.token, holder)

    def _take(self, pipe: Pipeline) -> tuple[bool, str]:
        """Under WATCH of the seat: (True, the previous holder or '') once taken, or (False, the live
        holder's token), a live holder being one whose channel still has a subscriber."""
        raw = pipe.get(seat_key(self.label))
        current = raw.decode() if raw is not None else ""
        if current and current != self.token:
            [(_channel, subscribers)] = pipe.pubsub_numsub(seat_channel_prefix(self.label) + current)
            if subscribers > 0:
                return False, current
        pipe.multi()
        pipe.set(seat_key(self.label), self.token)
        return True, current

    def check(self) -> None:
        """Keep the subscription read (a dropped connection is re-made and re-subscribed), and notice
        a seat another process took while this one was cut off from Redis."""
        with self._lock:
            if self._pubsub is None:
                return
            self._pubsub.get_message(timeout=0)
        holder = self._client.get(seat_key(self.label))
        if holder is not None and holder.decode() != self.token and not self._lost:
            self._lost = True
            self._on_lost(
                f"{self.label}'s seat was taken by another worker ({holder.decode()[:8]}) while this one "
                "was cut off from Redis: two workers were started on one GPU; this one stops"
            )

    def release(self) -> None:
        """Give the seat up (a clean stop): the next worker on this GPU needs no proof of death."""
        self._keeper.stop()
        if self._taken:
            self._taken = False
            try:
                self._client.transaction(self._give_up, seat_key(self.label))
            except redis.RedisError as error:  # the closed subscription says as much
                log.warning("could not give up the seat of %s: %s", self.label, error)
        self._close_subscription()

    def _give_up(self, pipe: Pipeline) -> None:
        """Under WATCH of the seat: delete it if it is still this process's."""
        raw = pipe.get(seat_key(self.label))
        if raw is not None and raw.decode() == self.token:
            pipe.multi()
            pipe.delete(seat_key(self.label))

    def _close_subscription(self) -> None:
        with self._lock:
            pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            pubsub.close()
