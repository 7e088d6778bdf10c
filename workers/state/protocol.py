"""The exactly-once protocol's atomic steps: every Lua script draftgen runs in Redis, in one place.

docs/exactly-once.md tells the protocol as a story (enqueue -> lease -> stage -> commit, and
reconcile/recover/gc/verify), with the keys each step touches and the test that proves each invariant.
Every key a script touches is given by its caller (never built inside the script); ids and records
arrive through ARGV. The scripts run as the functions of one Redis library (`LIBRARY`, see
workers/state/function_library.py), which declares to Redis only the keys a script writes: the keys
marked "read" below travel by name, and the script still finds them in KEYS, in the order listed. The
Python faces are `workers.state.ledger.RunLedger` (stage, dead-letter, commit, recover),
`producer.enqueue.enqueuer.Enqueuer` (classify, claim), `workers.record.uploader.Uploader` (the flush lock),
`workers.state.quarantine.Quarantine` (records and batches kept apart),
`workers.record.finished_bodies` (finished batches' kept bodies), `workers.recovery.leases` and
`workers.recovery.reconciler`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import redis

from workers.state.function_library import READ, REST, WRITTEN, FunctionLibrary, LibraryFunction, LuaScript

# --------------------------------------------------------------------------- enqueue

# KEYS: done, staged, dead, then each id's bucket (RunKeys.ids), in the order of the ids. ARGV[1]: the
# chunk's ids as one JSON array (a thousand separate arguments cost more than the rest of enqueue
# together); ARGV[2]: '1' when ids the run holds but nothing carries (no batch is open: Redis was rebuilt
# by `recover`) are to be batched again; ARGV[3]: this enqueue's number. Returns one letter per id (new,
# already there, duplicate in the input: claimed by this same enqueue, or orphaned), then the holder of
# each id that is not new, in order.
NEW = "n"
ALREADY_THERE = "a"
DUPLICATE_IN_INPUT = "d"
ORPHANED = "o"
_HOLDER_HELPERS = """
-- the enqueue that claimed an id: its holder is that number, or a fingerprint 'digest|number|row[|file]'
local function claimed_by(holder)
  return string.match(holder, '^(%d+)$') or string.match(holder, '^[^|]*|(%d+)|')
end
"""
CLASSIFY = (
    _HOLDER_HELPERS
    + """
local out, held = {}, {}
for i, id in ipairs(cjson.decode(ARGV[1])) do
  local holder = redis.call('HGET', KEYS[3 + i], id)
  if not holder then out[i] = 'n'
  else
    table.insert(held, holder)
    if claimed_by(holder) == ARGV[3] then out[i] = 'd'
    elseif ARGV[2] == '1' and redis.call('SISMEMBER', KEYS[1], id) == 0
        and redis.call('HEXISTS', KEYS[2], id) == 0 and redis.call('HEXISTS', KEYS[3], id) == 0 then
      out[i] = 'o'
    else out[i] = 'a' end
  end
end
table.insert(held, 1, table.concat(out))
return held
"""
)

# Shared prologue: Redis's own clock in seconds, to the microsecond (the hosts' clocks may disagree).
_REDIS_CLOCK = """
local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end
"""

# The new ids join the run (each in its bucket, with its holder: the enqueue's number, or its
# fingerprint) with the batches that carry them, their outbox entries and their place among the run's
# open batches (scored by the Redis time they were dispatched). Only while this enqueue still holds the
# run's enqueue lock (renewed here): an enqueue that stalled past its lock may have been overtaken by
# another that claimed the same ids, so it claims nothing.
# KEYS: enqueued_count, unpublished, open_batches, enqueue_lock, then each id's bucket, then one batch key
# per batch. ARGV: lock token, lock lease ms, the ids (JSON), their holders (JSON, in the same order),
# then per batch: its blob and its id. Returns the number of ids the run did not hold yet, or the error
# LOCK_LOST.
LOCK_LOST = "LOCK_LOST"
CLAIM = (
    _REDIS_CLOCK
    + """
if redis.call('GET', KEYS[4]) ~= ARGV[1] then return redis.error_reply('LOCK_LOST') end
redis.call('PEXPIRE', KEYS[4], ARGV[2])
local ids, holders = cjson.decode(ARGV[3]), cjson.decode(ARGV[4])
local added = 0
for i, id in ipairs(ids) do added = added + redis.call('HSET', KEYS[4 + i], id, holders[i]) end
if added > 0 then redis.call('INCRBY', KEYS[1], added) end
local first_batch_key = 5 + #ids
local now = redis_now()
for i = 5, #ARGV, 2 do
  redis.call('SET', KEYS[first_batch_key + (i - 5) / 2], ARGV[i])
  redis.call('SADD', KEYS[2], ARGV[i + 1])
  redis.call('ZADD', KEYS[3], now, ARGV[i + 1])
end
return added
"""
)

# --------------------------------------------------------------------------- generate: hand-over

# Stage one completion unless the prompt is already staged, done or dead. The hand-over time comes
# from Redis's own clock, so the staged order is the order of hand-over across all hosts.
# A conversation's kept turns (KEYS[8]) go: it is staged whole.
# KEYS: done (read), dead (read), staged, staged_index, staged_bytes, stats, events, turns.
# ARGV: prompt id, blob, quality field, finish field, completion/reasoning/prompt tokens, gpu label,
# events kept, then the stats field names: completions, the three token totals, first completion, and
# the missing-token-ids counter (empty when the completion has its ids); then the turns field, the
# generated turns, and the quality and finish fields of each turn before the last.
STAGE = (
    _REDIS_CLOCK
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return 0
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HDEL', KEYS[8], ARGV[1])
redis.call('HINCRBY', KEYS[6], ARGV[16], ARGV[17])
for i = 18, #ARGV do redis.call('HINCRBY', KEYS[6], ARGV[i], 1) end
local now = redis_now()
redis.call('ZADD', KEYS[4], now, ARGV[1])
redis.call('INCRBY', KEYS[5], string.len(ARGV[2]))
redis.call('HINCRBY', KEYS[6], ARGV[10], 1)
redis.call('HINCRBY', KEYS[6], ARGV[3], 1)
redis.call('HINCRBY', KEYS[6], ARGV[4], 1)
redis.call('HINCRBY', KEYS[6], ARGV[11], ARGV[5])
redis.call('HINCRBY', KEYS[6], ARGV[12], ARGV[6])
redis.call('HINCRBY', KEYS[6], ARGV[13], ARGV[7])
redis.call('HSETNX', KEYS[6], ARGV[14], math.floor(now))
if ARGV[15] ~= '' then redis.call('HINCRBY', KEYS[6], ARGV[15], 1) end
redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[9], '*', 'tokens', ARGV[5], 'gpu', ARGV[8])
return 1
"""
)

# A dead letter is recorded once, and waits in dead_pending for the uploader to commit it.
# KEYS: done (read), staged (read), dead, stats, dead_pending, turns. ARGV: prompt id, letter (JSON), its
# stats field.
DEAD_LETTER = (
    _REDIS_CLOCK
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return 0
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
redis.call('ZADD', KEYS[5], redis_now(), ARGV[1])
return 1
"""
)

# A conversation's finished turns are kept, unless it is staged, done or dead already (a worker that
# lost its lease may still finish a turn after another staged the conversation).
# KEYS: done (read), staged (read), dead (read), turns. ARGV: prompt id, the turns (blob).
# Returns 1 when kept.
KEEP_TURNS = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1
  or redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
return 1
"""

# A prompt's poison evidence (workers/state/poison.py), kept across workers: one JSON event a line,
# appended, the oldest lines dropped past the byte limit. Nothing stored is decoded here: a record that is
# not ours costs only its bytes, and the reader skips what it cannot read.
# KEYS: strikes. ARGV: prompt id, the event (one line of JSON), the byte limit. Returns the record.
STRIKE = """
local kept = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if #kept > 0 and string.sub(kept, -1) ~= '\\n' then kept = kept .. '\\n' end
kept = kept .. ARGV[2] .. '\\n'
local limit = tonumber(ARGV[3])
if #kept > limit then
  local cut = string.find(kept, '\\n', #kept - limit, true)
  kept = cut and string.sub(kept, cut + 1) or ''
end
redis.call('HSET', KEYS[1], ARGV[1], kept)
return kept
"""

# --------------------------------------------------------------------------- upload: commit

# What the manifest says of a prompt wins over what Redis remembers of it: a Redis that lost its last
# writes may have forgotten a commit, and the prompt generated again since then may be staged or
# dead-lettered. Shared by COMMIT and MARK_COMMITTED, whose KEYS[1..6] are always done, staged,
# staged_index, staged_bytes, dead, dead_pending; `turns` is the run's kept conversation turns, which a
# committed prompt leaves too (a Redis that lost its last writes may still hold some of it).
_LEAVE_STAGED = """
local function leave_staged(id)
  local size = redis.call('HSTRLEN', KEYS[2], id)
  if size > 0 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('DECRBY', KEYS[4], size)
  end
  redis.call('ZREM', KEYS[3], id)
end
"""
_MARK_COMMITTED_HELPERS = (
    _LEAVE_STAGED
    + """
local function leave_upload_path(id)
  leave_staged(id)
  redis.call('ZREM', KEYS[6], id)
end
-- committed as a completion: done, and no dead letter of it remains
local function mark_done(id, turns)
  leave_upload_path(id)
  redis.call('HDEL', turns, id)
  redis.call('HDEL', KEYS[5], id)
  return redis.call('SADD', KEYS[1], id)
end
-- committed as a dead letter: dead (counted under `field` when Redis had forgotten it), nothing staged
local function mark_dead(id, letter, stats, field, turns)
  leave_upload_path(id)
  redis.call('HDEL', turns, id)
  if redis.call('HSETNX', KEYS[5], id, letter) == 1 then redis.call('HINCRBY', stats, field, 1) end
end
"""
)

# Commit one part: only while holding the upload lock, and only for the expected part number.
# KEYS: done, staged, staged_index, staged_bytes, dead, dead_pending, upload_lock (read), next_part,
# manifest, stats, turns. ARGV: lock token, part, manifest entry, the number N of completed prompt ids,
# those N ids, then per dead letter the part committed: its prompt id, the letter (JSON) and its stats field.
# Returns the number of prompts newly marked done, or an error when the lock or part changed.
COMMIT = (
    _MARK_COMMITTED_HELPERS
    + """
if redis.call('GET', KEYS[7]) ~= ARGV[1] then return redis.error_reply('LOCK_LOST') end
local part = tonumber(redis.call('GET', KEYS[8]) or '0')
if part ~= tonumber(ARGV[2]) then return redis.error_reply('PART_MOVED') end
local completed = tonumber(ARGV[4])
local newly = 0
for i = 5, 4 + completed do newly = newly + mark_done(ARGV[i], KEYS[11]) end
for i = 5 + completed, #ARGV, 3 do mark_dead(ARGV[i], ARGV[i + 1], KEYS[10], ARGV[i + 2], KEYS[11]) end
redis.call('RPUSH', KEYS[9], ARGV[3])
redis.call('SET', KEYS[8], part + 1)
return newly
"""
)

# Recovery: prompts found committed in the object store (ids as one JSON argument) are marked done,
# and held by the run (holder "0" when Redis knew nothing of them), whatever Redis remembered.
# KEYS: done, staged, staged_index, staged_bytes, dead, dead_pending, turns, enqueued_count, then each
# id's bucket, in the order of the ids.
MARK_COMMITTED = (
    _MARK_COMMITTED_HELPERS
    + """
local newly, added = 0, 0
for i, id in ipairs(cjson.decode(ARGV[1])) do
  newly = newly + mark_done(id, KEYS[7])
  added = added + redis.call('HSETNX', KEYS[8 + i], id, '0')
end
if added > 0 then redis.call('INCRBY', KEYS[8], added) end
return newly
"""
)

# Ids an enqueue claimed, as its output records them (recovery): each joins the run with its holder
# unless the run holds it already (then as recent). KEYS: enqueued_count, then each id's bucket.
# ARGV: the ids (JSON), their holders (JSON, in the same order). Returns how many joined.
# The number of each file named (a folder's or an S3 prefix's), given at its first sight: fingerprints
# hold it instead of the name. KEYS: files. ARGV: the names. Returns their numbers, in order.
NUMBER_FILES = """
local out = {}
for i, name in ipairs(ARGV) do
  local number = redis.call('HGET', KEYS[1], 'n:' .. name)
  if not number then
    number = redis.call('HINCRBY', KEYS[1], 'count', 1)
    redis.call('HSET', KEYS[1], 'n:' .. name, number, 'i:' .. number, name)
  end
  out[i] = tonumber(number)
end
return out
"""

HOLD_IDS = """
local ids, holders = cjson.decode(ARGV[1]), cjson.decode(ARGV[2])
local added = 0
for i, id in ipairs(ids) do added = added + redis.call('HSETNX', KEYS[1 + i], id, holders[i]) end
if added > 0 then redis.call('INCRBY', KEYS[1], added) end
return added
"""

# The flush lock's lease, renewed per part and released by its holder only. KEYS: the lock.
EXTEND_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# --------------------------------------------------------------------------- batch leases

# A lease says which task execution generates a batch, until when (Redis clock). Its holder renews
# it; a lease that runs out is taken back by the reconciler, which dispatches the batch again.
# Shared prologue: `now` in seconds, and whether ARGV-given owner holds a batch's live lease.
_LEASE_HELPERS = (
    _REDIS_CLOCK
    + """
local now = redis_now()
local function holder_of(leases, owners, id)
  local raw = redis.call('HGET', owners, id)
  if not raw then return nil, 0 end
  return cjson.decode(raw).owner, tonumber(redis.call('ZSCORE', leases, id) or '0')
end
"""
)

# KEYS: batch (read), open_batches, leases, lease_owners. ARGV: batch id, holder (JSON with `owner`), owner,
# TTL s.
# Returns 'acquired', 'held' (another execution's lease is live) or 'finished' (the batch is gone).
ACQUIRE_LEASE = (
    _LEASE_HELPERS
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  return 'finished'
end
local owner, expiry = holder_of(KEYS[3], KEYS[4], ARGV[1])
if owner and owner ~= ARGV[3] and expiry > now then return 'held' end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[1])
return 'acquired'
"""
)

# KEYS: leases, lease_owners, then each renewed batch's key (read). ARGV: TTL s, then per batch: id, owner,
# holder (JSON). A lease still ours (even one that ran out and was not yet taken back) is extended.
# Any other is lost: another execution holds it, the reconciler took it back, it was handed back (a
# hand-back may land between the renewer's reading of its leases and this call: taking the lease
# again would strand the batch's retry as `held`), or the batch is gone. Returns the ids of the lost.
RENEW_LEASES = (
    _LEASE_HELPERS
    + """
local lost = {}
for i = 2, #ARGV, 3 do
  local id, mine = ARGV[i], ARGV[i + 1]
  local owner = holder_of(KEYS[1], KEYS[2], id)
  local batch_key = KEYS[3 + (i - 2) / 3]
  if owner == mine and redis.call('EXISTS', batch_key) == 1 then
    redis.call('HSET', KEYS[2], id, ARGV[i + 2])
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), id)
  else
    table.insert(lost, id)
  end
end
return lost
"""
)

# Hand a batch back without finishing it: the lease goes (if ours, or nobody's) and the reconciler
# leaves the batch alone for `delay` seconds, while its retry message waits for its countdown.
# KEYS: open_batches, leases, lease_owners. ARGV: batch id, owner, delay s. Returns 1, or 0 when
# another execution holds the batch (then it is left to that one).
RELEASE_LEASE = (
    _LEASE_HELPERS
    + """
local owner, expiry = holder_of(KEYS[2], KEYS[3], ARGV[1])
if owner and owner ~= ARGV[2] and expiry > now then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
return 1
"""
)

# Every prompt of the batch is handed over (or dead-lettered): the batch and its bookkeeping go. Only
# on Redis's word, not the worker's: a Redis that lost its last second of writes may have forgotten a
# hand-over the worker saw acknowledged, and a batch deleted then would strand that prompt for good.
# Its body is kept (renamed `finished_batch`, each prompt's batch noted in `finished_prompts`) until
# the uploader has committed every prompt of it: a prompt quarantined meanwhile re-opens the batch
# (QUARANTINE_RECORD). To ACQUIRE_LEASE and RENEW_LEASES the batch is gone, as before.
# KEYS: batch, open_batches, leases, lease_owners, batch_failures, done (read), staged (read), dead (read),
# finished_batch, finished_batches, finished_prompts.
# ARGV: batch id, then the batch's prompt ids. Returns the ids neither done, staged nor dead: when
# there are any, nothing is changed and the caller hands the batch back.
FINISH_BATCH = (
    _REDIS_CLOCK
    + """
local unsettled = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('SISMEMBER', KEYS[6], id) == 0 and redis.call('HEXISTS', KEYS[7], id) == 0
      and redis.call('HEXISTS', KEYS[8], id) == 0 then
    table.insert(unsettled, id)
  end
end
if #unsettled > 0 then return unsettled end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('RENAME', KEYS[1], KEYS[9])
  redis.call('ZADD', KEYS[10], redis_now(), ARGV[1])
  for i = 2, #ARGV do redis.call('HSET', KEYS[11], ARGV[i], ARGV[1]) end
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return unsettled
"""
)

# --------------------------------------------------------------------------- quarantine (state/quarantine.py)

# A staged completion or pending dead letter the uploader could not trust leaves the upload path, kept
# apart with its reason; a real prompt it held is generated again: its finished batch is re-opened (the
# generate worker skips the batch's settled prompts). A batch still open needs nothing: FINISH_BATCH
# refuses it while the prompt is unsettled, and it is handed back. Only while holding the upload lock.
# KEYS: done (read), staged, staged_index, staged_bytes, dead, dead_pending (the layout of COMMIT's),
# upload_lock (read), quarantined, finished_prompts, finished_batches, open_batches, then the finished
# body and the body of the batch the caller found in finished_prompts (keys of batch id '' when none).
# ARGV: lock token, prompt id (the record's field), where it was ('staged' or 'dead'), the quarantine
# field, the entry (JSON), the batch id the caller found ('' for none), '1' when the id is the run's.
# Returns what became of the prompt: 'settled' (nothing to generate), 'reopened', 'open' (its batch is
# being generated), 'unfinished' (no finished batch holds it: its batch is open, or gone with a Redis
# rebuilt by `recover`), 'gone' (its finished body is lost); the error STALE when finished_prompts no
# longer says what the caller found (a batch finished meanwhile: look again), or LOCK_LOST.
QUARANTINE_RECORD = (
    _REDIS_CLOCK
    + _LEAVE_STAGED
    + """
if redis.call('GET', KEYS[7]) ~= ARGV[1] then return redis.error_reply('LOCK_LOST') end
local id, batch = ARGV[2], ARGV[6]
if (redis.call('HGET', KEYS[9], id) or '') ~= batch then return redis.error_reply('STALE') end
if ARGV[3] == 'staged' then
  leave_staged(id)
elseif redis.call('ZREM', KEYS[6], id) == 1 then
  redis.call('HDEL', KEYS[5], id)
end
redis.call('HSET', KEYS[8], ARGV[4], ARGV[5])
if ARGV[7] ~= '1' or redis.call('SISMEMBER', KEYS[1], id) == 1 or redis.call('HEXISTS', KEYS[2], id) == 1
    or redis.call('HEXISTS', KEYS[5], id) == 1 then
  return 'settled'
end
if batch == '' then return 'unfinished' end
if redis.call('EXISTS', KEYS[12]) == 0 then
  if redis.call('EXISTS', KEYS[13]) == 1 then return 'open' end
  return 'gone'
end
redis.call('RENAME', KEYS[12], KEYS[13])
redis.call('ZREM', KEYS[10], batch)
redis.call('ZADD', KEYS[11], redis_now(), batch)
return 'reopened'
"""
)

# A batch whose body cannot be read leaves the run's open batches, kept apart with its reason: its
# prompts are then held by no batch, and an `enqueue` re-run batches them again.
# KEYS: batch, open_batches, leases, lease_owners, batch_failures, quarantined. ARGV: batch id, the
# quarantine field, the entry (JSON).
QUARANTINE_BATCH = """
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('HSET', KEYS[6], ARGV[2], ARGV[3])
return 1
"""

# The uploader's judgement of kept finished bodies (workers/record/finished_bodies.py), only while it
# holds the upload lock: the bodies whose every prompt is committed go (with their prompts' entries in
# finished_prompts), unreadable ones go to the quarantine, and the rest are judged again last.
# KEYS: upload_lock (read), finished_batches, finished_prompts, quarantined, then the body of each
# batch forgotten, then of each dropped, in order. ARGV: lock token, the forgotten batches with their
# prompt ids (JSON [[batch, [id, ...]], ...]), the dropped with their quarantine field and entry (JSON
# [[batch, field, entry], ...]), the batches kept (JSON [batch, ...]). Returns how many were forgotten.
FORGET_FINISHED = (
    _REDIS_CLOCK
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('LOCK_LOST') end
local forgotten, dropped, kept = cjson.decode(ARGV[2]), cjson.decode(ARGV[3]), cjson.decode(ARGV[4])
local body = 5
for _, item in ipairs(forgotten) do
  redis.call('DEL', KEYS[body])
  body = body + 1
  redis.call('ZREM', KEYS[2], item[1])
  for _, id in ipairs(item[2]) do
    if redis.call('HGET', KEYS[3], id) == item[1] then redis.call('HDEL', KEYS[3], id) end
  end
end
for _, item in ipairs(dropped) do
  redis.call('DEL', KEYS[body])
  body = body + 1
  redis.call('ZREM', KEYS[2], item[1])
  redis.call('HSET', KEYS[4], item[2], item[3])
end
local now = redis_now()
for _, batch in ipairs(kept) do redis.call('ZADD', KEYS[2], 'XX', now, batch) end
return #forgotten
"""
)

# --------------------------------------------------------------------------- reconciliation

# Take back every lease that ran out: the batch becomes dispatchable now. KEYS: open_batches, leases,
# lease_owners. Returns id, holder (JSON, or '' when unknown) pairs, for the caller to dispatch again.
EXPIRE_LEASES = (
    _LEASE_HELPERS
    + """
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  local raw = redis.call('HGET', KEYS[3], id) or ''
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZADD', KEYS[1], 'XX', now, id)
  table.insert(out, id)
  table.insert(out, raw)
end
return out
"""
)

# Of the given open batches, those that nobody leases are dispatched again now (their score moves
# to now, so the next pass judges them afresh). KEYS: open_batches, leases (read). ARGV: batch ids.
# Returns the ids the caller must publish.
REDISPATCH = (
    _REDIS_CLOCK
    + """
local now = redis_now()
local out = {}
for _, id in ipairs(ARGV) do
  if redis.call('ZSCORE', KEYS[2], id) == false and redis.call('ZSCORE', KEYS[1], id) ~= false then
    redis.call('ZADD', KEYS[1], now, id)
    table.insert(out, id)
  end
end
return out
"""
)


# --------------------------------------------------------------------------- seats (workers/recovery/seat.py)

# A new seat holder takes back, at once, every lease held under its label by another seat: those
# holders are dead (taking the seat proved it). Their batches become dispatchable now. KEYS: open_batches,
# leases, lease_owners. ARGV: the label, the new holder's seat token. Returns id, holder (JSON) pairs.
TAKE_BACK_SEAT_LEASES = (
    _REDIS_CLOCK
    + """
local now = redis_now()
local out = {}
local flat = redis.call('HGETALL', KEYS[3])
for i = 1, #flat, 2 do
  local ok, holder = pcall(cjson.decode, flat[i + 1])
  if ok and type(holder) == 'table' and holder.worker == ARGV[1] and holder.seat ~= ARGV[2] then
    redis.call('ZREM', KEYS[2], flat[i])
    redis.call('HDEL', KEYS[3], flat[i])
    redis.call('ZADD', KEYS[1], 'XX', now, flat[i])
    table.insert(out, flat[i])
    table.insert(out, flat[i + 1])
  end
end
return out
"""
)


# Each script with the access of its keys (function_library.LuaScript.key_access): those marked "read"
# above are not declared to Redis, so a user needs no write permission on them.
_W, _R = WRITTEN, READ
LIBRARY = FunctionLibrary.of(
    "draftgen",
    [
        LuaScript("classify", CLASSIFY, writes_nothing=True),
        LuaScript("claim", CLAIM),
        LuaScript("hold_ids", HOLD_IDS),
        LuaScript("number_files", NUMBER_FILES),
        LuaScript("stage", STAGE, key_access=_R * 2 + _W * 6),
        LuaScript("dead_letter", DEAD_LETTER, key_access=_R * 2 + _W * 4),
        LuaScript("strike", STRIKE),
        LuaScript("keep_turns", KEEP_TURNS, key_access=_R * 3 + _W),
        LuaScript("commit", COMMIT, key_access=_W * 6 + _R + _W * 4),
        LuaScript("mark_committed", MARK_COMMITTED),
        LuaScript("extend_lock", EXTEND_LOCK),
        LuaScript("release_lock", RELEASE_LOCK),
        LuaScript("acquire_lease", ACQUIRE_LEASE, key_access=_R + _W * 3),
        LuaScript("renew_leases", RENEW_LEASES, key_access=_W * 2 + _R + REST),
        LuaScript("release_lease", RELEASE_LEASE),
        LuaScript("finish_batch", FINISH_BATCH, key_access=_W * 5 + _R * 3 + _W * 3),
        LuaScript("quarantine_record", QUARANTINE_RECORD, key_access=_R + _W * 5 + _R + _W * 6),
        LuaScript("quarantine_batch", QUARANTINE_BATCH),
        LuaScript("forget_finished", FORGET_FINISHED, key_access=_R + _W + REST),
        LuaScript("expire_leases", EXPIRE_LEASES),
        LuaScript("redispatch", REDISPATCH, key_access=_W + _R),
        LuaScript("take_back_seat_leases", TAKE_BACK_SEAT_LEASES),
    ],
)


@dataclass(frozen=True)
class Scripts:
    """Every script, as a function of LIBRARY on one client (binding is local: the library is loaded by
    the first call that finds it missing, when the client's user may load it)."""

    classify: LibraryFunction
    claim: LibraryFunction
    hold_ids: LibraryFunction
    number_files: LibraryFunction
    stage: LibraryFunction
    dead_letter: LibraryFunction
    strike: LibraryFunction
    keep_turns: LibraryFunction
    commit: LibraryFunction
    mark_committed: LibraryFunction
    extend_lock: LibraryFunction
    release_lock: LibraryFunction
    acquire_lease: LibraryFunction
    renew_leases: LibraryFunction
    release_lease: LibraryFunction
    finish_batch: LibraryFunction
    quarantine_record: LibraryFunction
    quarantine_batch: LibraryFunction
    forget_finished: LibraryFunction
    expire_leases: LibraryFunction
    redispatch: LibraryFunction
    take_back_seat_leases: LibraryFunction

    @classmethod
    def register(cls, client: redis.Redis) -> Scripts:
        return cls(**{field.name: LIBRARY.bind(client, field.name) for field in fields(cls)})
