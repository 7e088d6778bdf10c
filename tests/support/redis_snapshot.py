"""A model of Redis losing its last writes: take a snapshot of every key, later put Redis back to it.

With `appendfsync everysec`, a power loss (or a failover to a replica that lagged) loses up to the last
second of acknowledged writes: Redis comes back as it was at some earlier instant. `take` records every
key (DUMP, with its remaining time to live); `restore` empties the database and puts those keys back,
so every process then talks to the Redis of that instant, as after such a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

SCAN_COUNT = 1000
NO_EXPIRY = -1


@dataclass(frozen=True)
class RedisSnapshot:
    keys: dict[bytes, tuple[bytes, int]]  # key -> (DUMP payload, remaining TTL ms or NO_EXPIRY)

    @classmethod
    def take(cls, client: redis.Redis) -> RedisSnapshot:
        names = list(client.scan_iter(count=SCAN_COUNT))
        with client.pipeline(transaction=True) as pipe:
            for name in names:
                pipe.dump(name)
                pipe.pttl(name)
            replies = pipe.execute()
        kept = {
            name: (payload, ttl)
            for name, payload, ttl in zip(names, replies[::2], replies[1::2], strict=True)
            if payload is not None  # expired between the scan and the dump
        }
        return cls(kept)

    def restore(self, client: redis.Redis) -> None:
        with client.pipeline(transaction=True) as pipe:
            pipe.flushdb()
            for name, (payload, ttl) in self.keys.items():
                pipe.restore(name, 0 if ttl == NO_EXPIRY else max(ttl, 1), payload)
            pipe.execute()
