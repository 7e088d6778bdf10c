"""A run's state in Redis, changed only through atomic steps.

A prompt moves enqueued -> staged (handed over by a generate worker) -> done (in a committed
object), or enqueued -> dead. Each step is one of workers.state.protocol's scripts, so no crash can leave a
prompt half-moved, and each is idempotent, so a redelivered message can replay it harmlessly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TypeVar

import msgspec
import redis

from core.records import Completion, DeadLetter, Origin, Prompt, Turn
from workers.errors import RecordTooLarge, RecordUnreadable
from workers.state.codec import compress, decode_blob, decode_json, encode_blob, encode_json
from workers.state.keys import RunKeys
from workers.state.poison import EVIDENCE_MAX_BYTES, Evidence, decode_evidence, encode_evidence
from workers.state.protocol import Scripts
from workers.state.record_limits import (
    DEAD_LETTER_ERROR_MAX_CHARS,
    RECORD_LIMIT_BYTES,
    SMALL_RECORD_LIMIT_BYTES,
)
from workers.state.stats_fields import (
    COMPLETION_TOKENS,
    COMPLETIONS,
    FIRST_COMPLETION_AT,
    PROMPT_TOKENS,
    REASONING_TOKENS,
    TOKEN_IDS_MISSING,
    TURNS,
    dead_field,
    finish_field,
    quality_field,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

BUCKETS_PER_READ = 1024
SCAN_COUNT = 10_000
EVENTS_KEPT = 200_000  # completion events kept per run for recent rates (about an hour at 50/s)


SERVER_IDENTITY_CHARS = 8  # of a worker's seat token: tells its strikes from its predecessors'


def server_identity(seat_token: str) -> str:
    """How a worker process names its server's lives in poison records: `<label>#<identity>.<life>`."""
    return seat_token[:SERVER_IDENTITY_CHARS]


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
    dead_pending: int = 0  # dead letters not yet committed to the object store

    @property
    def remaining(self) -> int:
        """Prompts that still need a completion: neither staged, committed nor dead-lettered."""
        return self.enqueued - self.staged - self.done - self.dead


class RunLedger:
    def __init__(self, client: redis.Redis, run: str) -> None:
        self.client = client
        self.keys = RunKeys(run)
        self._scripts = Scripts.register(client)

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
        """Hand a completion to the upload path and count it; False when the prompt already had one.
        RecordTooLarge when its record is past the record limit: the uploader would refuse it."""
        record = encode_json(completion)
        if len(record) > RECORD_LIMIT_BYTES:
            raise RecordTooLarge(
                f"its record is {len(record):,} bytes, past the record limit of {RECORD_LIMIT_BYTES:,}"
            )
        keys = [
            self.keys.done,
            self.keys.dead,
            self.keys.staged,
            self.keys.staged_index,
            self.keys.staged_bytes,
            self.keys.stats,
            self.keys.events,
            self.keys.turns,
        ]
        turns = completion.turns()
        args: list[str | bytes | int] = [
            completion.prompt_id,
            compress(record),
            quality_field(completion.quality.value),
            finish_field(completion.finish_reason),
            completion.output_tokens(),
            sum(turn.usage.reasoning_tokens for turn in turns),
            sum(turn.usage.prompt_tokens for turn in turns),
            gpu_label(completion.origin),
            EVENTS_KEPT,
            COMPLETIONS,
            COMPLETION_TOKENS,
            REASONING_TOKENS,
            PROMPT_TOKENS,
            FIRST_COMPLETION_AT,
            TOKEN_IDS_MISSING if completion.response_token_ids is None else "",
            TURNS,
            len(turns),
        ]
        for turn in completion.earlier_turns:
            args += [quality_field(turn.quality.value), finish_field(turn.finish_reason)]
        return bool(self._scripts.stage(keys=keys, args=args))

    def keep_turns(self, prompt_id: str, turns: list[Turn]) -> bool:
        """Keep a conversation's finished turns for a later delivery; False when it is settled already."""
        keys = [self.keys.done, self.keys.staged, self.keys.dead, self.keys.turns]
        return bool(self._scripts.keep_turns(keys=keys, args=[prompt_id, encode_blob(turns)]))

    def kept_turns(self, prompt_ids: Sequence[str]) -> dict[str, list[Turn]]:
        """The finished turns kept of these conversations (those with none are left out). Turns that
        cannot be read are dropped: that conversation starts over."""
        kept, unreadable = self._each_readable(
            self.keys.turns,
            prompt_ids,
            lambda _prompt_id, raw: decode_blob(raw, list[Turn], limit_bytes=RECORD_LIMIT_BYTES),
        )
        if unreadable:
            self.client.hdel(self.keys.turns, *unreadable)
        return kept

    def dead_letter(self, letter: DeadLetter) -> bool:
        keys = [
            self.keys.done,
            self.keys.staged,
            self.keys.dead,
            self.keys.stats,
            self.keys.dead_pending,
            self.keys.turns,
        ]
        if len(letter.error) > DEAD_LETTER_ERROR_MAX_CHARS:  # so that every dead letter fits its ceiling
            letter = msgspec.structs.replace(letter, error=letter.error[:DEAD_LETTER_ERROR_MAX_CHARS] + "…")
        args = [letter.prompt_id, msgspec.json.encode(letter), dead_field(letter.reason)]
        return bool(self._scripts.dead_letter(keys=keys, args=args))

    def strike(self, prompt_id: str, event: Evidence) -> list[Evidence]:
        """Add one event to a prompt's poison record (workers/state/poison.py); returns the whole record,
        as every worker left it."""
        raw = self._scripts.strike(
            keys=[self.keys.strikes], args=[prompt_id, encode_evidence(event), EVIDENCE_MAX_BYTES]
        )
        return decode_evidence(raw, prompt_id)

    def strikes_of(self, prompt_ids: Sequence[str]) -> dict[str, list[Evidence]]:
        """The poison records of these prompts (those with none are left out; a record that is not ours
        is no evidence: `decode_evidence` never raises)."""
        records, _ = self._each_readable(
            self.keys.strikes, prompt_ids, lambda prompt_id, raw: decode_evidence(raw, prompt_id)
        )
        return records

    def _each_readable(
        self, key: str, prompt_ids: Sequence[str], decode: Callable[[str, bytes], T]
    ) -> tuple[dict[str, T], list[str]]:
        """Each prompt's value in the hash `key` that can be read, and the prompts whose value cannot."""
        if not prompt_ids:
            return {}, []
        found: dict[str, T] = {}
        unreadable: list[str] = []
        for prompt_id, raw in zip(prompt_ids, self.client.hmget(key, list(prompt_ids)), strict=True):
            if raw is None:
                continue
            try:
                found[prompt_id] = decode(prompt_id, raw)
            except RecordUnreadable as error:
                log.warning("%s of %s cannot be read, left out: %s", key, prompt_id, error)
                unreadable.append(prompt_id)
        return found, unreadable

    def commit(
        self,
        *,
        lock_token: str,
        part: int,
        manifest_entry: bytes,
        prompt_ids: Sequence[str],
        dead_letters: Sequence[DeadLetter] = (),
    ) -> int:
        """Mark a committed part's prompts done and its dead letters dead and committed, in one atomic
        step, whatever Redis remembered of them (a Redis that lost its last writes may have forgotten
        the letters, or the prompt may have been generated again since)."""
        keys = [
            *self._committed_keys(),
            self.keys.upload_lock,
            self.keys.next_part,
            self.keys.manifest,
            self.keys.stats,
            self.keys.turns,
        ]
        args: list[str | bytes | int] = [lock_token, part, manifest_entry, len(prompt_ids), *prompt_ids]
        for letter in dead_letters:
            args += [letter.prompt_id, msgspec.json.encode(letter), dead_field(letter.reason)]
        return int(self._scripts.commit(keys=keys, args=args))

    def mark_committed(self, prompt_ids: list[str]) -> int:
        """Record prompts the object store shows committed (recovery); returns how many were not done."""
        keys = [
            *self._committed_keys(),
            self.keys.turns,
            self.keys.enqueued_count,
            *(self.keys.ids(prompt_id) for prompt_id in prompt_ids),
        ]
        return int(self._scripts.mark_committed(keys=keys, args=[msgspec.json.encode(prompt_ids)]))

    def hold_ids(self, holders: dict[str, str]) -> int:
        """Ids the run accepted, each with its holder (RunKeys.ids), unless it holds them already;
        returns how many joined."""
        if not holders:
            return 0
        keys = [self.keys.enqueued_count, *(self.keys.ids(prompt_id) for prompt_id in holders)]
        args = [msgspec.json.encode(list(holders)), msgspec.json.encode(list(holders.values()))]
        return int(self._scripts.hold_ids(keys=keys, args=args))

    def enqueued_ids(self) -> set[str]:
        """Every id the run has accepted (reads all its buckets: for verify and checks, not a loop)."""
        found: set[str] = set()
        buckets = self.client.scan_iter(match=f"{self.keys.ids_prefix}*", count=SCAN_COUNT)
        while keys := list(islice(buckets, BUCKETS_PER_READ)):
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hkeys(key)
                for fields in pipe.execute():
                    found.update(field.decode() for field in fields)
        return found

    def _committed_keys(self) -> list[str]:
        """Where a committed prompt is marked and what it leaves (the scripts' shared KEYS[1..6])."""
        return [
            self.keys.done,
            self.keys.staged,
            self.keys.staged_index,
            self.keys.staged_bytes,
            self.keys.dead,
            self.keys.dead_pending,
        ]

    def counts(self) -> RunCounts:
        with self.client.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.enqueued_count)
            pipe.zcard(self.keys.staged_index)
            pipe.scard(self.keys.done)
            pipe.hlen(self.keys.dead)
            pipe.zcard(self.keys.dead_pending)
            enqueued, staged, done, dead, dead_pending = pipe.execute()
        return RunCounts(
            enqueued=int(enqueued or 0), staged=staged, done=done, dead=dead, dead_pending=dead_pending
        )

    def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter Redis holds that can be read."""
        letters = []
        for raw in self.client.hvals(self.keys.dead):
            try:
                letters.append(decode_json(raw, DeadLetter, limit_bytes=SMALL_RECORD_LIMIT_BYTES))
            except RecordUnreadable as error:
                log.warning("a dead letter left out: %s", error)
        return letters
