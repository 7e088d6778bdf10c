"""A model of Redis losing its last writes: take a snapshot of every key, later put Redis back to it.

With `appendfsync everysec`, a power loss (or a failover to a replica that lagged) loses up to the last
second of acknowledged writes: Redis comes back as it was at some earlier instant. `take` records every
key (DUMP, with its remaining time to live); `restore` empties the database and puts those keys back,
so every process then talks to the Redis of that instant, as after such a crash.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

NO_EXPIRY = -1

# Every key with its DUMP and its remaining time to live, in one step: nothing changes in between.
_DUMP_ALL = """
local out = {}
local cursor = '0'
repeat
  local page = redis.call('SCAN', cursor, 'COUNT', 1000)
  cursor = page[1]
  for _, name in ipairs(page[2]) do
    table.insert(out, name)
    table.insert(out, redis.call('DUMP', name))
    table.insert(out, redis.call('PTTL', name))
  end
until cursor == '0'
return out
"""


@dataclass(frozen=True)
class RedisSnapshot:
    keys: dict[bytes, tuple[bytes, int]]  # key -> (DUMP payload, remaining TTL ms or NO_EXPIRY)

    @classmethod
    def take(cls, client: redis.Redis) -> RedisSnapshot:
        flat = client.eval(_DUMP_ALL, 0)
        return cls(
            {
                name: (payload, int(ttl))
                for name, payload, ttl in zip(flat[::3], flat[1::3], flat[2::3], strict=True)
            }
        )

    def restore(self, client: redis.Redis) -> None:
        with client.pipeline(transaction=True) as pipe:
            pipe.flushdb()
            for name, (payload, ttl) in self.keys.items():
                pipe.restore(name, 0 if ttl == NO_EXPIRY else max(ttl, 1), payload)
            pipe.execute()
