"""A generate worker's seat: one live process per GPU, and a restarted worker takes its batches back soon.

A worker's identity is its GPU label (`host/gpuN`, or `host/<server URL>`), the one `status` shows.
A process holds the label's seat by subscribing to a channel of its own, `draftgen:seat:<label>:<token>`,
on a connection kept for its whole life, and by writing its token in `draftgen:seats:<label>`. Redis
drops a subscription the moment its connection closes, and the kernel closes every socket of a process
that ends, SIGKILL and OOM kill included. Plain commands, not a Redis function, so a worker takes its seat
before anything has loaded the protocol's functions (a fleet started before its first enqueue).

But a missing subscription alone proves nothing: a Redis restart, a failover or a dropped connection
takes every subscription away from live holders too. So a holder also stamps the seat at every check
(recovery/seat_stamp.py: its token, the Redis server, that server's time), and a newcomer that finds the
holder unsubscribed takes the seat only once the holder has been silent for `HOLDER_GONE_AFTER_S`: by the
stamp, when it was written on this same Redis server (a kill, an OOM: the common case, at once when the
restart took that long); else by watching the seat itself for `SEAT_WATCHED_S` of Redis being reachable
without a break (after a Redis restart or a failover: a live holder subscribes and stamps again within
`RESUBSCRIBE_WITHIN_S` of reaching Redis). A subscriber seen meanwhile refuses the newcomer. A seat that
names nobody is free (a clean stop deletes it), once Redis has been up `RESUBSCRIBE_WITHIN_S`: a Redis
that lost its last writes may have lost a live holder's seat, which that holder writes again when it
listens again. Taking the seat checks all this under WATCH of the seat key and writes the token in one
transaction.

Why that is safe: the only processes whose leases a new seat holder takes back are those that held the
same label and showed no sign of life for longer than a live holder that reaches Redis ever does. Such a
process is dead, or cut off from Redis for that long and unsubscribed: Redis closes a cut-off client's
connection only when TCP keepalive gives up on it (deploy/redis.conf's `tcp-keepalive 60`: about two
minutes, measured in docs/failures.md), so a newcomer is refused until then. The cut-off process stopped
sending requests when its leases ran out by its own clock (60 s), and it stops itself as soon as it
reaches Redis again and sees another holder. A frozen process (SIGSTOP) keeps its connection, and its
seat, until it is killed.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis
from redis.backoff import ConstantBackoff
from redis.client import Pipeline, PubSub
from redis.retry import Retry

from workers.errors import SeatHeld, SeatRefused
from workers.periodic import PeriodicThread
from workers.recovery.seat_stamp import (
    ServerView,
    Stamp,
    decode_stamp,
    encode_stamp,
    silent_for_s,
    view_server,
)
from workers.state.keys import seat_channel, seat_channel_prefix, seat_key, seat_seen_key

log = logging.getLogger(__name__)

SEAT_CHECK_S = 0.5  # how often the holder reads its subscription and stamps the seat
# The holder's subscription reconnects on a connection of its own, quickly and not for long: its keeper
# tries again at its next check rather than waiting out the workers' client's half-minute retries.
RECONNECT_BACKOFF_CAP_S = 0.25
RECONNECT_RETRIES = 2
# A connected holder listens again within this of Redis coming back: measured 0.1-0.5 s on an idle
# machine, 3.3 s once on two cores under a full test load (docs/failures.md).
RESUBSCRIBE_WITHIN_S = 5.0
SEAT_WATCHED_S = 2 * RESUBSCRIBE_WITHIN_S  # watched vacant this long after a restart: the holder is gone
# A holder that reaches Redis stamps every SEAT_CHECK_S, subscribed or not: silent ten times as long by
# its stamp on this same server, it is gone (dead, or cut off and unsubscribed).
HOLDER_GONE_AFTER_S = 10 * SEAT_CHECK_S
VACANCY_POLL_S = 0.25  # how often a newcomer looks at the seat it waits for
# A newcomer's look at the seat that took longer than this waited on Redis (away, or slow): what it saw
# before proves nothing, and its watch starts again.
VACANCY_POLL_GAP_S = 2.0
# How long taking a seat waits for Redis's answer to SUBSCRIBE (milliseconds, normally): a refusal read
# later would let the seat look held by its live holder, and the worker say the wrong reason.
SUBSCRIBE_ANSWER_S = 5.0


def _up_long_enough(view: ServerView, watched_s: float) -> bool:
    """Whether Redis has served long enough for every live holder to have written its seat again since it
    came back (by its uptime; by this process's own watch when it may not ask)."""
    up_s = view.up_s if view.up_s is not None else watched_s
    return up_s >= RESUBSCRIBE_WITHIN_S


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
        self,
        client: redis.Redis,
        label: str,
        *,
        on_lost: Callable[[str], None],
        token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        server: Callable[[Any], ServerView] = view_server,
    ) -> None:
        self._client = client
        self.label = label
        self.token = token or uuid.uuid4().hex
        self._on_lost = on_lost
        self._clock = clock
        self._sleep = sleep
        self._view_server = server
        self._pubsub: PubSub | None = None
        self._lock = threading.Lock()
        self._lost = False
        self._taken = False
        self._keeper = PeriodicThread("draftgen-seat", SEAT_CHECK_S, self.check)

    @property
    def taken(self) -> bool:
        """Whether this process holds the seat (its keeper stamps it) until it releases it."""
        return self._taken

    def take(self) -> TakenSeat:
        """Hold the seat, once its holder (if any) is gone; raise SeatHeld when a live process holds it,
        SeatRefused when this process's Redis user may not hold it."""
        self._pubsub = self._subscription_client().pubsub(ignore_subscribe_messages=True)
        try:
            self._pubsub.subscribe(seat_channel(self.label, self.token))
            self._pubsub.get_message(timeout=SUBSCRIBE_ANSWER_S)  # its confirmation, or its refusal
            taken, holder = self._take_once_vacant()
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
        self._stamp()
        self._keeper.start()
        return TakenSeat(self.token, holder)

    def _subscription_client(self) -> redis.Redis:
        """A client of its own for the subscription: it reconnects within RESUBSCRIBE_WITHIN_S, whatever
        retries the worker's client makes its commands wait through."""
        options = dict(self._client.connection_pool.connection_kwargs)
        options["retry"] = Retry(ConstantBackoff(RECONNECT_BACKOFF_CAP_S), RECONNECT_RETRIES)
        pool = self._client.connection_pool.__class__(
            connection_class=self._client.connection_pool.connection_class, **options
        )
        return redis.Redis(connection_pool=pool)

    def _take_once_vacant(self) -> tuple[bool, str]:
        """(True, the previous holder or '') once taken, or (False, the live holder's token)."""
        watched: str | None = None
        watched_since = last_look = self._clock()
        while True:
            take = partial(self._take_if, watched=watched, watched_since=watched_since)
            taken, holder, listened = self._client.transaction(
                take, seat_key(self.label), seat_seen_key(self.label), value_from_callable=True
            )
            if taken:
                return True, holder
            if listened:
                return False, holder
            now = self._clock()
            if holder != watched or now - last_look > VACANCY_POLL_GAP_S:
                if holder != watched:
                    log.info(
                        "the seat of %s is held by %s, which does not listen (or Redis has just come back): "
                        "taking it once that holder has been silent %.0f s",
                        self.label,
                        holder[:8] or "nobody",
                        HOLDER_GONE_AFTER_S,
                    )
                watched, watched_since = holder, now
            last_look = now
            self._sleep(VACANCY_POLL_S)

    def _take_if(
        self, pipe: Pipeline, *, watched: str | None, watched_since: float
    ) -> tuple[bool, str, bool]:
        """Under WATCH of the seat and its stamp: (taken, holder, whether the holder lives). The seat is
        taken when it is this process's, free on a Redis up long enough for every live holder to listen
        again, or held by a holder gone: silent for HOLDER_GONE_AFTER_S by its stamp on this server, or,
        its stamp telling nothing, watched vacant (`watched` since `watched_since`) for SEAT_WATCHED_S. A
        holder subscribed, or stamping all that while, lives."""
        raw = pipe.get(seat_key(self.label))
        current = raw.decode() if raw is not None else ""
        view = self._view_server(pipe)
        watched_s = self._clock() - watched_since if current == watched else 0.0
        if view.up_s is not None:  # a watch counts only what this server saw: not across its restart
            watched_s = min(watched_s, view.up_s)
        if not current and not _up_long_enough(view, watched_s):
            return False, current, False  # a seat this Redis lost with its last writes looks free
        if current and current != self.token:
            [(_channel, subscribers)] = pipe.pubsub_numsub(seat_channel_prefix(self.label) + current)
            if subscribers > 0:
                return False, current, True
            silent_s = silent_for_s(decode_stamp(pipe.get(seat_seen_key(self.label))), current, view)
            if silent_s is not None and silent_s < HOLDER_GONE_AFTER_S:
                # it stamps, so it lives; unsubscribed all this while, it is a live holder all the same
                return False, current, watched_s >= SEAT_WATCHED_S
            if silent_s is None and watched_s < SEAT_WATCHED_S:
                return False, current, False
        pipe.multi()
        pipe.set(seat_key(self.label), self.token)
        return True, current, False

    def check(self) -> None:
        """Stamp the seat, keep the subscription read (a dropped connection is re-made and re-subscribed),
        and notice a seat another live process took while this one was cut off from Redis. A seat that
        names nobody, or a process nobody listens for (a Redis that lost its last writes gave it back to a
        dead predecessor), is taken again."""
        holder = self._client.get(seat_key(self.label))
        if self._taken and not self._lost and self._given_back(holder):
            holder = self._take_again_from(holder)
        if holder is not None and holder.decode() == self.token:
            self._stamp()
        with self._lock:
            if self._pubsub is None:
                return
            self._pubsub.get_message(timeout=0)
        # another process's token, and it listens: a live process holds the seat (one that does not listen
        # is dead: the seat is taken again at the next check)
        another = holder is not None and holder.decode() != self.token
        if another and not self._lost and not self._given_back(holder):
            self._lost = True
            self._on_lost(
                f"{self.label}'s seat was taken by another worker ({holder.decode()[:8]}) while this one "
                "was cut off from Redis (longer than Redis keeps a silent connection, or a second worker "
                "was started on this GPU); this one stops"
            )

    def _given_back(self, holder: bytes | None) -> bool:
        """Whether the seat names nobody, or another process that does not listen: a Redis that lost its
        last writes gave it back to a dead one (this process lives, and a process that takes a seat
        listens before it writes its token)."""
        if holder is None:
            return True
        if holder.decode() == self.token:
            return False
        channel = seat_channel_prefix(self.label) + holder.decode()
        [(_channel, subscribers)] = self._client.pubsub_numsub(channel)
        return not subscribers

    def _take_again_from(self, given_back: bytes | None) -> bytes | None:
        """Under WATCH of the seat: this process's token again, unless the seat changed meanwhile; the
        seat's holder after."""

        def take_again(pipe: Pipeline) -> bytes | None:
            raw: bytes | None = pipe.get(seat_key(self.label))
            if raw != given_back:
                return raw
            pipe.multi()
            pipe.set(seat_key(self.label), self.token)
            return self.token.encode()

        held: bytes | None = self._client.transaction(
            take_again, seat_key(self.label), value_from_callable=True
        )
        if held == self.token.encode():
            log.warning("%s's seat was given back by a Redis that lost its writes: taken again", self.label)
        return held

    def _stamp(self) -> None:
        """Show this holder lives, on this Redis server by its clock (recovery/seat_stamp.py)."""
        view = self._view_server(self._client)
        self._client.set(seat_seen_key(self.label), encode_stamp(Stamp(self.token, view.server, view.now_s)))

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
            pipe.delete(seat_key(self.label), seat_seen_key(self.label))

    def _close_subscription(self) -> None:
        with self._lock:
            pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            pubsub.close()
