"""After `enqueue`: the run's claims on every replica before the command says it is done.

With a Sentinel group (deploy/multi-node.md, section 6) the primary's writes reach its replicas a moment
later, and a failover loses what the promoted replica had not received. Every other write the protocol
loses that way heals by itself (docs/performance.md, "Commit durability"), but an enqueue's claims are
its only record in Redis: a claim lost after `enqueue` said "new N prompts" would wait silently for a
re-run. So enqueue waits, once at its end, until every replica has acknowledged the primary's offset
(`ROLE`: read-only, no write of its own, so any connection may ask), and says so; a replica that does not
catch up within `CATCH_UP_S` is a warning to re-run the same `enqueue` should the primary fail over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

CATCH_UP_S = 10.0
POLL_S = 0.1
PRIMARY_ROLE = b"master"
REPLICA_FIELDS = 3  # [ip, port, acknowledged offset]


class ReplicasUnknown(Exception):
    """Redis would not say which replicas it has: enqueue cannot wait for them."""


def _role(client: redis.Redis) -> Any:
    try:
        return client.execute_command("ROLE")
    except redis.ResponseError as error:  # NOPERM included
        raise ReplicasUnknown(
            f"Redis refused ROLE ({error}), so enqueue could not wait for its replicas to have the claims: "
            "give the producer's user +role (this version's deploy/redis-users.acl, ACL LOAD)"
        ) from error


@dataclass(frozen=True)
class ReplicaCatchUp:
    replicas: int
    caught_up: int

    def line(self) -> str:
        replicas = "replica" if self.replicas == 1 else "replicas"
        return f"replicated          every claim on {self.caught_up} of {self.replicas} {replicas}"

    def warning(self) -> str | None:
        if self.caught_up == self.replicas:
            return None
        return (
            f"{self.replicas - self.caught_up} of {self.replicas} replicas had not caught up with the claims "
            f"after {CATCH_UP_S:.0f} s: should the primary fail over before they do, run the same enqueue "
            "again (it adds only what Redis lost)"
        )


def primary_offsets(reply: Any) -> tuple[int, list[int]] | None:
    """The primary's replication offset and each replica's acknowledged one, from `ROLE`; None from a
    server that is no primary, or a reply of another shape."""
    if not isinstance(reply, list) or len(reply) != REPLICA_FIELDS or reply[0] != PRIMARY_ROLE:
        return None
    offset, replicas = reply[1], reply[2]
    if not isinstance(offset, int) or not isinstance(replicas, list):
        return None
    acknowledged: list[int] = []
    for replica in replicas:
        if not isinstance(replica, list) or len(replica) != REPLICA_FIELDS:
            return None
        try:
            acknowledged.append(int(replica[2]))
        except (TypeError, ValueError):
            return None
    return offset, acknowledged


def wait_for_replicas(
    client: redis.Redis,
    *,
    timeout_s: float = CATCH_UP_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReplicaCatchUp | None:
    """Until every replica has acknowledged the primary's offset as it is now, or the timeout; None where
    the server has no replica (or says nothing readable). A server that refuses ROLE (a user of an older
    ACL file, a service that renames it) raises ReplicasUnknown."""
    offsets = primary_offsets(_role(client))
    if offsets is None or not offsets[1]:
        return None
    target = offsets[0]
    deadline = clock() + timeout_s
    while True:
        caught_up = sum(1 for acknowledged in offsets[1] if acknowledged >= target)
        if caught_up == len(offsets[1]) or clock() >= deadline:
            return ReplicaCatchUp(replicas=len(offsets[1]), caught_up=caught_up)
        sleep(POLL_S)
        offsets = primary_offsets(_role(client))
        if offsets is None:
            return None
