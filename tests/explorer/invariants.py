"""What must hold after every step of an explored schedule, and at its end.

After every step:
- no prompt is in two stored batches (two enqueues, or an enqueue and a requeue, batched it twice), a
  finished batch's kept body counting as one (a quarantined prompt re-opens it);
- no kept body of a finished batch holds a prompt that still needs generating (nothing would generate it);
- no lease a holder gave up (handed back, or finished) is held again in Redis by that holder;
- the output commits no prompt twice, and none both as a completion and as a dead letter;
- `status` says `finished` only when the output holds every prompt Redis counts as enqueued;
- no conversation staged, done or dead still has turns kept for a resume;
- no live generate worker is told its seat was taken, and no seat is taken from a live holder (a second
  worker started on a live GPU label, a worker restarted after a kill, around Redis dropping every
  subscription and losing its last writes);
- no live worker renews a lease that no execution of it holds any more (a batch that ended in any way,
  the function library missing included, gave its lease back);
- no message of draftgen's own is parked as malformed;
- no prompt but those planted as poison (wedging its server, hanging, killing its worker) is
  dead-lettered as poison.
At the end, once faults have stopped and the fleet has worked on: no malformed message is left queued
(each was parked, or lost with the rest), and no worker holds a message for later than draftgen's longest
countdown; the output alone (no Redis) holds every input prompt exactly once, committed or dead-lettered,
and no id the input lacks (a forged staged record's), each planted poison prompt dead-lettered as poison;
every committed conversation holds all its turns in order, no turns are kept any more, and `status` says
`finished`. That the run got there within the bound on its time is the explorer's to check
(tests/explorer/liveness.py).
"""

from __future__ import annotations

from collections import Counter

import msgspec

from core.records import DeadLetter, DeadLetterReason, PromptBatch
from producer.status.figures import STATE_FINISHED
from producer.status.gather import gather_status
from producer.upkeep.verify import verify_run
from tests.explorer.fleet import RUN, Fleet, turn_answer
from workers.broker.kombu_layout import waiting_envelopes
from workers.broker.message_check import why_malformed
from workers.record.manifest import MANIFEST_PREFIX, completion_keys, read_manifest
from workers.record.parquet_io import read_completions
from workers.record.reading import read_committed
from workers.recovery.leases import decode_holder
from workers.state.codec import decode_blob
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.queues import CLOCK_SKEW_S, GENERATE_QUEUE, LONGEST_COUNTDOWN_S
from workers.state.record_limits import RECORD_LIMIT_BYTES

# The stored batches (open, and finished ones' kept bodies), the lease holders, and the prompts a kept
# finished body holds unsettled, in one round trip: this runs after every action.
_BATCHES_AND_HOLDERS = """
local function settled(id)
  return redis.call('SISMEMBER', KEYS[3], id) == 1 or redis.call('HEXISTS', KEYS[4], id) == 1
    or redis.call('HEXISTS', KEYS[5], id) == 1
end
local blobs = {}
for pattern = 1, 2 do
  local cursor = '0'
  repeat
    local page = redis.call('SCAN', cursor, 'MATCH', ARGV[pattern], 'COUNT', 1000)
    cursor = page[1]
    for _, name in ipairs(page[2]) do table.insert(blobs, redis.call('GET', name)) end
  until cursor == '0'
end
local settled_but_kept = {}
for _, id in ipairs(redis.call('HKEYS', KEYS[2])) do
  if settled(id) then table.insert(settled_but_kept, id) end
end
local finished_unsettled = {}
local finished = redis.call('HGETALL', KEYS[6])
for i = 1, #finished, 2 do
  if redis.call('EXISTS', ARGV[3] .. finished[i + 1]) == 1 and not settled(finished[i]) then
    table.insert(finished_unsettled, finished[i])
  end
end
return {blobs, redis.call('HGETALL', KEYS[1]), settled_but_kept, finished_unsettled}
"""


class Invariants:
    """Checks one fleet; counts how many checks it made."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._keys = RunKeys(RUN)
        self._manifest_seen = -1
        self._in_output: set[str] = set()  # prompts the output holds, committed or dead-lettered
        self._said_at: tuple[int, bool] = (-1, False)  # (action, whether status said finished)
        self._read = fleet.admin.register_script(_BATCHES_AND_HOLDERS)
        self.checked = 0

    def after_step(self) -> list[str]:
        keys = self._keys
        finished_prefix = keys.finished_batch("")
        blobs, holders, settled_but_kept, finished_unsettled = self._read(
            keys=[keys.lease_owners, keys.turns, keys.done, keys.staged, keys.dead, keys.finished_prompts],
            args=[f"{keys.batches_prefix}*", f"{finished_prefix}*", finished_prefix],
        )
        found = [
            *self._batches(blobs),
            *self._revived_leases(dict(zip(holders[::2], holders[1::2], strict=True))),
            *self._output(),
            *self._status(),
            *(
                f"conversation {raw.decode()} is settled and still has turns kept"
                for raw in settled_but_kept
                if raw.decode() not in self._fleet.forged  # a forger writes staged, and no turns go
            ),
            *(
                f"prompt {raw.decode()} is unsettled in a finished batch"
                for raw in finished_unsettled
                if raw.decode() not in self._in_output  # committed: Redis forgot it, a flush adopts it again
            ),
            *self._seats(),
            *self._leaked_leases(),
            *self._parked(),
            *self._poison(),
        ]
        self.checked += 10
        return found

    def _poison(self) -> list[str]:
        """Only the prompts planted as poison are dead-lettered as poison (Redis's dead letters)."""
        found = []
        for raw in self._fleet.admin.hvals(self._keys.dead):
            letter = msgspec.json.decode(raw, type=DeadLetter)
            ordinary = letter.prompt_id not in self._fleet.poison_kinds
            if letter.reason == DeadLetterReason.POISON_PROMPT and ordinary:
                found.append(f"ordinary {letter.prompt_id} was dead-lettered as poison: {letter.error}")
        return found

    def _parked(self) -> list[str]:
        """No message of draftgen's own is parked."""
        found = list(self._fleet.bus.parked_ours)
        self._fleet.bus.parked_ours.clear()
        return found

    def _seats(self) -> list[str]:
        """No live worker is told its seat was taken, and no seat is taken from a live holder."""
        fleet = self._fleet
        found = [*fleet.seat_losses, *fleet.seat_violations]
        fleet.seat_losses.clear()
        fleet.seat_violations.clear()
        return found

    def _leaked_leases(self) -> list[str]:
        """No live worker renews a lease that no execution of it holds any more."""
        return [
            f"{worker.process.name} renews the lease of batch {lease.batch_id}, held by no execution of it"
            for worker in self._fleet.workers
            if not worker.process.dead
            for lease in worker.unaccounted_leases()
        ]

    def _batches(self, blobs: list[bytes]) -> list[str]:
        holder: dict[str, str] = {}
        found: list[str] = []
        for blob in blobs:
            batch = decode_blob(blob, PromptBatch, limit_bytes=RECORD_LIMIT_BYTES)
            for one in batch.prompts:
                if one.id in holder:
                    found.append(f"prompt {one.id} is in batches {holder[one.id]} and {batch.batch_id}")
                holder[one.id] = batch.batch_id
        return found

    def _revived_leases(self, holders: dict[bytes, bytes]) -> list[str]:
        found = []
        for batch_id, raw in holders.items():
            holder = decode_holder(raw)
            if holder is not None and holder.owner in self._fleet.gone_leases:
                found.append(
                    f"batch {batch_id.decode()} is leased again by {holder.worker}'s execution "
                    f"{holder.owner[:8]}, which gave it up at action {self._fleet.gone_leases[holder.owner]}"
                )
        return found

    def _output(self) -> list[str]:
        listed = sum(1 for _ in self._fleet.store.list(MANIFEST_PREFIX))
        if listed == self._manifest_seen:
            return []
        self._manifest_seen = listed
        record = read_committed(self._fleet.store)
        self._in_output = set(record.completed) | set(record.dead)
        found = [f"prompt {p} committed {n} times" for p, n in record.completed.items() if n > 1]
        found += [f"prompt {p} dead-lettered {n} times" for p, n in record.dead_occurrences.items() if n > 1]
        found += [f"prompt {p} committed and dead-lettered" for p in set(record.completed) & set(record.dead)]
        return found

    def _status_finished(self) -> bool:
        """What `status` says, read only when the counts leave it a chance to say finished (the
        whole status costs a few milliseconds, and this runs after every action). Read once an action."""
        if self._said_at[0] != self._fleet.action:
            counts = RunLedger(self._fleet.admin, RUN).counts()
            possible = counts.enqueued and not (counts.remaining > 0 or counts.staged or counts.dead_pending)
            finished = bool(possible) and gather_status(self._fleet.admin, RUN).state == STATE_FINISHED
            self._said_at = (self._fleet.action, finished)
        return self._said_at[1]

    def _status(self) -> list[str]:
        if not self._status_finished():
            return []
        enqueued = RunLedger(self._fleet.admin, RUN).enqueued_ids()
        record = read_committed(self._fleet.store)
        missing = sorted(enqueued - set(record.completed) - set(record.dead))
        return [f"status says finished, and the output lacks {missing}"] if missing else []

    def at_end(self) -> list[str]:
        self.checked += 1
        report = verify_run(self._fleet.store, RUN)
        wanted = {one.id for one in self._fleet.prompts}
        record = read_committed(self._fleet.store)
        held = Counter(record.completed) + Counter(record.dead_occurrences)
        found = []
        if not report.ok:
            found.append(
                f"verify --output fails: missing {report.missing}, duplicated {report.duplicated}, "
                f"committed and dead {report.committed_and_dead}, broken {report.broken_objects}"
            )
        lacking = sorted(wanted - set(held))
        if lacking:
            found.append(f"the output lacks input prompts {lacking}")
        for poison, kind in self._fleet.poison_kinds.items():
            if poison not in record.dead:
                found.append(f"{poison}, which {kind.value} every time, was not dead-lettered")
            elif record.dead[poison].reason != DeadLetterReason.POISON_PROMPT:
                found.append(f"{poison} was dead-lettered as {record.dead[poison].reason}, not as poison")
        foreign = sorted(set(held) - wanted)
        if foreign:
            found.append(f"the output holds ids the input lacks: {foreign}")
        found += self._conversations()
        if left := self._malformed_queued():
            found.append(f"{left} malformed messages were never taken off the queue")
        found += [
            f"{worker.process.name} holds a message of {held.batch_id} for {held.eta_s - now:,.0f} s from now"
            for worker in self._fleet.workers
            for held in worker.held
            if held.eta_s - (now := self._fleet.clock.now_s) > LONGEST_COUNTDOWN_S + CLOCK_SKEW_S
        ]
        if self._fleet.admin.hlen(self._keys.turns):
            found.append(f"turns are still kept of {self._fleet.admin.hkeys(self._keys.turns)}")
        if gather_status(self._fleet.admin, RUN).state != STATE_FINISHED:
            found.append(f"status is not finished: {gather_status(self._fleet.admin, RUN).progress}")
        return found

    def _malformed_queued(self) -> int:
        queued = waiting_envelopes(self._fleet.admin, GENERATE_QUEUE)
        return sum(1 for raw in queued if why_malformed(raw, GENERATE_QUEUE, now_s=self._fleet.clock.now_s))

    def _conversations(self) -> list[str]:
        """Every committed conversation holds its turns in order, each answered once."""
        turns = {one.id: one.turn_count for one in self._fleet.prompts if one.turn_ends}
        found = []
        for key in completion_keys(read_manifest(self._fleet.store)):
            for row in read_completions(self._fleet.store.get(key)):
                if row.prompt_id not in turns:
                    continue
                answers = [turn.content for turn in row.turns()]
                wanted = [turn_answer(row.prompt_id, j) for j in range(1, turns[row.prompt_id] + 1)]
                if answers != wanted or row.conversation_turns != turns[row.prompt_id]:
                    found.append(f"conversation {row.prompt_id} is committed with turns {answers}")
        return found

    def finished(self) -> bool:
        """The run is over: status says finished, the output holds every input prompt, and the workers have
        taken every malformed message off the queue (they consume a finished run's queue as any other)."""
        if not self._status_finished() or self._malformed_queued():
            return False
        record = read_committed(self._fleet.store)
        return {one.id for one in self._fleet.prompts} <= set(record.completed) | set(record.dead)
