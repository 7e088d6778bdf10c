"""A seat holder's stamp: the Redis server it last showed it lives on, and when by that server's clock.

A seat's subscription alone cannot tell a dead holder from a live one whose subscription a Redis restart,
a failover or a dropped connection took away (recovery/seat.py). The holder therefore also stamps, at every
check, `draftgen:seats:<label>:seen` with its token, the `run_id` of the Redis server it wrote to (a new
one after every restart, and on every other server after a failover) and that server's time. A newcomer
that finds the holder unsubscribed reads the stamp: written on this same server, its age is how long the
holder has been silent (a live holder that reaches Redis stamps every check, subscribed or not); written
on another server (or not at all), it proves nothing, and the newcomer watches the seat itself instead.
The server's uptime says whether it came back so recently that its seats' holders may not be listening
again yet (a seat Redis lost with its last writes looks free).
A stamp is read from Redis, so it is decoded with a bound and a malformed one counts as no stamp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

STAMP_MAX_BYTES = 256
SERVER_SECTION = "server"
RUN_ID_FIELD = "run_id"
UPTIME_FIELD = "uptime_in_seconds"
MICROSECONDS_PER_S = 1e6


@dataclass(frozen=True)
class Stamp:
    token: str
    server: str  # the run_id of the Redis server it was written on; '' when that was not known
    at_s: float  # that server's clock


def encode_stamp(stamp: Stamp) -> str:
    return f"{stamp.token} {stamp.server} {stamp.at_s:.3f}"


def decode_stamp(raw: bytes | None) -> Stamp | None:
    if raw is None or len(raw) > STAMP_MAX_BYTES:
        return None
    parts = raw.decode(errors="replace").split(" ")
    if len(parts) != 3:
        return None
    try:
        return Stamp(token=parts[0], server=parts[1], at_s=float(parts[2]))
    except ValueError:
        return None


@dataclass(frozen=True)
class ServerView:
    """The Redis server a client speaks to, as a seat needs it."""

    server: str  # its run_id: a new one after every restart, another on another server; '' when unknown
    now_s: float  # its clock
    up_s: float | None  # how long it has been up; None when unknown


def view_server(client: Any) -> ServerView:
    """The server `client` (a client, or a pipeline in immediate mode under WATCH) speaks to; its run_id
    and uptime unknown when this Redis user may not ask INFO."""
    seconds, microseconds = client.time()
    now_s = float(seconds) + float(microseconds) / MICROSECONDS_PER_S
    try:
        info = client.info(SERVER_SECTION)
    except redis.exceptions.NoPermissionError:
        return ServerView("", now_s, None)
    up_s = info.get(UPTIME_FIELD)
    return ServerView(str(info.get(RUN_ID_FIELD, "")), now_s, float(up_s) if up_s is not None else None)


def silent_for_s(stamp: Stamp | None, holder: str, view: ServerView) -> float | None:
    """How long `holder` has shown no sign of life on this server, or None when its stamp cannot tell
    (none, another holder's, written on another server, or this server's identity unknown)."""
    if stamp is None or stamp.token != holder or not view.server or stamp.server != view.server:
        return None
    return max(0.0, view.now_s - stamp.at_s)
