"""The kept bodies of finished batches: forgotten once every prompt of theirs is committed.

FINISH_BATCH keeps a batch's body (`finished_batch:<id>`) so that a prompt quarantined after its batch
finished can be generated again. The uploader, holding the upload lock, judges the least recently judged
bodies after each part it commits (and once the upload path is empty): a body whose every prompt is done,
or dead-lettered with its letter committed, goes (FORGET_FINISHED); one that cannot be read goes to the
quarantine; the rest are judged again later. A chunk that frees nothing ends the judging: the bodies
still waiting are those whose prompts are not committed yet.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis

from core.records import PromptBatch
from workers.errors import RecordUnreadable
from workers.state.codec import decode_blob
from workers.state.keys import RunKeys
from workers.state.protocol import Scripts
from workers.state.quarantine import QuarantinedRecord, QuarantineKind, encode_entry, unreadable

log = logging.getLogger(__name__)

FINISHED_BODIES_READ_AT_ONCE = 256
FINISHED_BODIES_JUDGED_PER_CALL = 8192  # well past the batches a part of 1,000 prompts can close


@dataclass
class Judged:
    forgotten: dict[str, list[str]] = field(default_factory=dict)  # batch -> its prompt ids
    dropped: list[QuarantinedRecord] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


class FinishedBodies:
    def __init__(self, client: redis.Redis, scripts: Scripts) -> None:
        self._client = client
        self._scripts = scripts

    def forget_committed(
        self,
        keys: RunKeys,
        lock_token: str,
        *,
        body_limit_bytes: int,
        keep_in_output: Callable[[Sequence[QuarantinedRecord]], object],
    ) -> int:
        """Forget the kept bodies whose prompts are all committed; returns how many went."""
        judged = forgotten = 0
        while judged < FINISHED_BODIES_JUDGED_PER_CALL:
            batch_ids = [
                raw.decode()
                for raw in self._client.zrange(keys.finished_batches, 0, FINISHED_BODIES_READ_AT_ONCE - 1)
            ]
            if not batch_ids:
                break
            verdict = self._judge(keys, batch_ids, body_limit_bytes)
            if verdict.dropped:
                keep_in_output(verdict.dropped)
            self._scripts.forget_finished(
                keys=[
                    keys.upload_lock,
                    keys.finished_batches,
                    keys.finished_prompts,
                    keys.quarantined,
                    *(keys.finished_batch(batch_id) for batch_id in verdict.forgotten),
                    *(keys.finished_batch(entry.id) for entry in verdict.dropped),
                ],
                args=[
                    lock_token,
                    json.dumps(list(verdict.forgotten.items())),
                    json.dumps([[e.id, e.field, encode_entry(e).decode()] for e in verdict.dropped]),
                    json.dumps(verdict.kept),
                ],
            )
            judged += len(batch_ids)
            forgotten += len(verdict.forgotten)
            if not verdict.forgotten and not verdict.dropped:
                break
        return forgotten

    def _judge(self, keys: RunKeys, batch_ids: list[str], body_limit_bytes: int) -> Judged:
        verdict = Judged()
        bodies: dict[str, list[str]] = {}
        for batch_id, blob in zip(
            batch_ids, self._client.mget([keys.finished_batch(b) for b in batch_ids]), strict=True
        ):
            if blob is None:  # gone already: only its place in the set is left
                verdict.forgotten[batch_id] = []
                continue
            try:
                batch = decode_blob(blob, PromptBatch, limit_bytes=body_limit_bytes)
            except RecordUnreadable as error:
                log.error("finished batch %s: its kept body cannot be read: %s", batch_id, error)
                verdict.dropped.append(
                    unreadable(
                        QuarantineKind.FINISHED_BATCH,
                        batch_id,
                        blob,
                        error,
                        inflated_limit_bytes=body_limit_bytes,
                    )
                )
                continue
            bodies[batch_id] = [one.id for one in batch.prompts]
        committed = self._committed(keys, [i for ids in bodies.values() for i in ids])
        for batch_id, ids in bodies.items():
            if all(prompt_id in committed for prompt_id in ids):
                verdict.forgotten[batch_id] = ids
            else:
                verdict.kept.append(batch_id)
        return verdict

    def _committed(self, keys: RunKeys, ids: list[str]) -> set[str]:
        """The ids committed: done, or dead-lettered with the letter no longer pending (asked only of the
        few that are not done)."""
        if not ids:
            return set()
        done = {i for i, is_done in zip(ids, self._client.smismember(keys.done, ids), strict=True) if is_done}
        rest = [i for i in ids if i not in done]
        if not rest:
            return done
        with self._client.pipeline(transaction=False) as pipe:
            for prompt_id in rest:
                pipe.hexists(keys.dead, prompt_id)
            pipe.zmscore(keys.dead_pending, rest)
            replies = pipe.execute()
        dead, pending = replies[:-1], replies[-1]
        return done | {
            prompt_id
            for prompt_id, is_dead, pending_since in zip(rest, dead, pending, strict=True)
            if is_dead and pending_since is None
        }
