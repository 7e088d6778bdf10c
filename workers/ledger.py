"""A run's state in Redis, changed only through atomic steps.

A prompt moves enqueued -> staged (handed over by a generate worker) -> done (in a committed
object), or enqueued -> dead. Each step is a Lua script, so no crash can leave a prompt half-moved,
and each is idempotent, so a redelivered message can replay it harmlessly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec
import redis

from inference.records import Completion, DeadLetter, Origin, Prompt
from workers.codec import encode_blob
from workers.keys import RunKeys

# Stage one completion unless the prompt is already staged, done or dead. The hand-over time comes
# from Redis's own clock, so the staged order is the order of hand-over across all hosts.
_STAGE = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return 0
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then return 0 end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[4], tonumber(now[1]) + tonumber(now[2]) / 1e6, ARGV[1])
redis.call('INCRBY', KEYS[5], string.len(ARGV[2]))
redis.call('HINCRBY', KEYS[6], 'completions', 1)
redis.call('HINCRBY', KEYS[6], 'quality:' .. ARGV[3], 1)
redis.call('HINCRBY', KEYS[6], 'finish:' .. ARGV[4], 1)
redis.call('HINCRBY', KEYS[6], 'completion_tokens', ARGV[5])
redis.call('HINCRBY', KEYS[6], 'reasoning_tokens', ARGV[6])
redis.call('HINCRBY', KEYS[6], 'prompt_tokens', ARGV[7])
redis.call('HSETNX', KEYS[6], 'first_completion_at', now[1])
redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[9], '*', 'tokens', ARGV[5], 'gpu', ARGV[8])
return 1
"""

_DEAD_LETTER = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return 0
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[4], 'dead:' .. ARGV[3], 1)
return 1
"""

# Marking a prompt committed: into `done`, out of the upload path. Shared by the scripts below, whose
# KEYS[3..6] are always done, staged, staged_index, staged_bytes.
_MARK_DONE = """
local function mark_done(id)
  local added = redis.call('SADD', KEYS[3], id)
  local size = redis.call('HSTRLEN', KEYS[4], id)
  if size > 0 then
    redis.call('HDEL', KEYS[4], id)
    redis.call('DECRBY', KEYS[6], size)
  end
  redis.call('ZREM', KEYS[5], id)
  return added
end
"""

# Commit one object: only while holding the upload lock, and only for the expected part number.
# Returns the number of prompts newly marked done, or an error when the lock or part changed.
_COMMIT = (
    _MARK_DONE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('LOCK_LOST') end
local part = tonumber(redis.call('GET', KEYS[2]) or '0')
if part ~= tonumber(ARGV[2]) then return redis.error_reply('PART_MOVED') end
local newly = 0
for i = 4, #ARGV do newly = newly + mark_done(ARGV[i]) end
redis.call('RPUSH', KEYS[7], ARGV[3])
redis.call('SET', KEYS[2], part + 1)
return newly
"""
)

# Recovery: prompts found committed in the object store (ids as one JSON argument) are marked done,
# and enqueued (KEYS[1]), whatever Redis remembered.
_MARK_COMMITTED = (
    _MARK_DONE
    + """
local newly = 0
for _, id in ipairs(cjson.decode(ARGV[1])) do
  newly = newly + mark_done(id)
  redis.call('SADD', KEYS[1], id)
end
return newly
"""
)


EVENTS_KEPT = 200_000  # completion events kept per run for recent rates (about an hour at 50/s)


def gpu_label(origin: Origin) -> str:
    """`host/gpuN`, or `host/url` for a worker configured by URL: one status row per GPU."""
    return (
        f"{origin.host}/gpu{origin.gpu}" if origin.gpu is not None else f"{origin.host}/{origin.server_url}"
    )


@dataclass(frozen=True)
class RunCounts:
    enqueued: int
    staged: int
    done: int
    dead: int

    @property
    def remaining(self) -> int:
        """Prompts that still need a completion: neither staged, committed nor dead-lettered."""
        return self.enqueued - self.staged - self.done - self.dead


class RunLedger:
    def __init__(self, client: redis.Redis, run: str) -> None:
        self.client = client
        self.keys = RunKeys(run)
        self._stage = client.register_script(_STAGE)
        self._dead_letter = client.register_script(_DEAD_LETTER)
        self._commit = client.register_script(_COMMIT)
        self._mark_committed = client.register_script(_MARK_COMMITTED)

    def pending(self, prompts: Sequence[Prompt]) -> list[Prompt]:
        """The prompts of a batch that still need generating (a redelivered batch skips the rest)."""
        if not prompts:
            return []
        ids = [p.id for p in prompts]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.smismember(self.keys.done, ids)
            pipe.hmget(self.keys.staged, ids)
            pipe.hmget(self.keys.dead, ids)
            done, staged, dead = pipe.execute()
        return [
            prompt
            for prompt, is_done, staged_blob, dead_blob in zip(prompts, done, staged, dead, strict=True)
            if not is_done and staged_blob is None and dead_blob is None
        ]

    def stage(self, completion: Completion) -> bool:
        """Hand a completion to the upload path and count it; False when the prompt already had one."""
        keys = [
            self.keys.done,
            self.keys.dead,
            self.keys.staged,
            self.keys.staged_index,
            self.keys.staged_bytes,
            self.keys.stats,
            self.keys.events,
        ]
        usage = completion.usage
        args = [
            completion.prompt_id,
            encode_blob(completion),
            completion.quality.value,
            completion.finish_reason,
            usage.completion_tokens,
            usage.reasoning_tokens,
            usage.prompt_tokens,
            gpu_label(completion.origin),
            EVENTS_KEPT,
        ]
        return bool(self._stage(keys=keys, args=args))

    def dead_letter(self, letter: DeadLetter) -> bool:
        keys = [self.keys.done, self.keys.staged, self.keys.dead, self.keys.stats]
        args = [letter.prompt_id, msgspec.json.encode(letter), letter.reason]
        return bool(self._dead_letter(keys=keys, args=args))

    def commit(self, *, lock_token: str, part: int, manifest_entry: bytes, prompt_ids: Iterable[str]) -> int:
        keys = [
            self.keys.upload_lock,
            self.keys.next_part,
            self.keys.done,
            self.keys.staged,
            self.keys.staged_index,
            self.keys.staged_bytes,
            self.keys.manifest,
        ]
        return int(self._commit(keys=keys, args=[lock_token, part, manifest_entry, *prompt_ids]))

    def mark_committed(self, prompt_ids: list[str]) -> int:
        """Record prompts the object store shows committed (recovery); returns how many were not done."""
        keys = [
            self.keys.enqueued,
            self.keys.next_part,  # unused: keeps KEYS[3..6] where _MARK_DONE expects them
            self.keys.done,
            self.keys.staged,
            self.keys.staged_index,
            self.keys.staged_bytes,
        ]
        return int(self._mark_committed(keys=keys, args=[msgspec.json.encode(prompt_ids)]))

    def counts(self) -> RunCounts:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.scard(self.keys.enqueued)
            pipe.zcard(self.keys.staged_index)
            pipe.scard(self.keys.done)
            pipe.hlen(self.keys.dead)
            enqueued, staged, done, dead = pipe.execute()
        return RunCounts(enqueued=enqueued, staged=staged, done=done, dead=dead)

    def dead_letters(self) -> list[DeadLetter]:
        return [msgspec.json.decode(raw, type=DeadLetter) for raw in self.client.hvals(self.keys.dead)]
