"""Every bad byte at once, on a fleet run with the README's defaults: while 300 prompts go through 2
simulated GPUs, a GPU node's password (the deploy ACL's `worker-node-a`) pushes every kind of malformed
message onto both queues, the remote-control and event channels and kombu's unacked hash, forges staged
records (bytes that are no record, a decompression bomb, another prompt's completion, an id never
enqueued) and a pending dead letter under the wrong prompt, and offers the queued tasks' ids as revoked.
No consumer exits (the same processes finish the run), every real prompt is committed exactly once, and
`status`, `parked` and `verify` name what was parked and quarantined."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import redis

from core.records import DeadLetter
from devstack.local_stack import wait_until
from tests.support import prompt_files
from tests.support.malformed_messages import (
    envelope_of,
    flush_item,
    generate_item,
    malformed_generate_items,
    malformed_upload_items,
)
from tests.support.records import completion, zstd_bomb
from tests.support.redis_head import (
    GPU_NODES,
    RedisHead,
    RoleStack,
    node_stack_running,
    node_user,
    redis_head_running,
)
from tests.support.stack import simulators_running
from workers.broker.broker import BrokerOptions, sending_app
from workers.broker.kombu_layout import waiting_envelopes
from workers.state.codec import encode_blob
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE, KOMBU_UNACKED_INDEX_KEY, KOMBU_UNACKED_KEY, UPLOAD_QUEUE
from workers.state.record_limits import RECORD_LIMIT_BYTES
from workers.state.redis_client import redis_now_s

pytestmark = pytest.mark.integration

RUN = "bad-bytes"
PROMPTS = 300
GPUS = 2
SPEEDUP = 50.0  # the README's `python -m inference simulate --speedup 50`
NODE = GPU_NODES[0]
WORKER = node_user(NODE)
FINISH_S = 300.0
FIRST_HAND_OVER_S = 60.0
WIDE_TERMINAL = "400"
NEVER_ENQUEUED = "never-enqueued"
BOMB_INFLATES_TO_BYTES = 2 * RECORD_LIMIT_BYTES


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisHead]:
    with redis_head_running(tmp_path_factory.mktemp("redis-head")) as head:
        yield head


@pytest.fixture
def fleet(head: RedisHead, log_dir: Path) -> Iterator[RoleStack]:
    """Two generate workers (as GPU node `node-a`) and the uploader, each as its own Redis user, with the
    README's defaults: no worker setting is changed."""
    with (
        simulators_running(GPUS, speedup=SPEEDUP) as sims,
        node_stack_running(head, log_dir, sims, malformed_sent=True, fast=False) as stack,
    ):
        yield stack


def not_yet_staged(client: redis.Redis, ids: list[str]) -> list[str]:
    keys = RunKeys(RUN)
    staged = client.hmget(keys.staged, ids)
    done = client.smismember(keys.done, ids)
    return [one for one, blob, is_done in zip(ids, staged, done, strict=True) if blob is None and not is_done]


def forge_staged(node: redis.Redis, field: str, blob: bytes) -> bool:
    """What a node's password can do without any function: a record under any field, indexed."""
    keys = RunKeys(RUN)
    if not node.hsetnx(keys.staged, field, blob):
        return False
    node.zadd(keys.staged_index, {field: redis_now_s(node)})
    node.incrby(keys.staged_bytes, len(blob))
    return True


def forge_unstaged(
    node: redis.Redis, reader: redis.Redis, candidates: list[str], blob_for: Callable[[str], bytes]
) -> bool:
    """Forge a record under the first of `candidates` its worker has not staged yet (the run goes on
    meanwhile: one found unstaged may be staged by the time the forgery lands, so the next is tried)."""
    return any(forge_staged(node, one, blob_for(one)) for one in not_yet_staged(reader, candidates))


def push_every_malformed_message(node: redis.Redis) -> int:
    item = generate_item(RUN, "0123456789abcdef")
    queued = [json.loads(raw) for raw in waiting_envelopes(node, GENERATE_QUEUE)]
    task_id = queued[0]["headers"]["id"] if queued else "0f0f0f0f-0000-4000-8000-000000000000"
    on_generate = malformed_generate_items(item, expired_task_id=task_id)
    on_upload = malformed_upload_items(item, flush_item(RUN))
    for raw, _reason in on_generate:
        node.lpush(GENERATE_QUEUE, raw)
    for raw, _reason in on_upload:
        node.lpush(UPLOAD_QUEUE, raw)
    node.publish("/0.celery.pidbox", b"[]")
    node.publish("/0.celeryev/worker.heartbeat", b"5")
    node.hset(KOMBU_UNACKED_KEY, "forged", b"x")
    node.zadd(KOMBU_UNACKED_INDEX_KEY, {"forged": 0})
    return len(on_generate) + len(on_upload)


def offer_queued_tasks_as_revoked(url: str, node: redis.Redis) -> None:
    """A `hello` from another node carrying the ids of tasks still queued: no worker may discard them."""
    ids = [envelope_of(raw)["headers"]["id"] for raw in waiting_envelopes(node, GENERATE_QUEUE)]
    app = sending_app(BrokerOptions(url, visibility_timeout_s=7200, unacked_restore_interval_s=10))
    app.control.broadcast("hello", arguments={"from_node": "evil@elsewhere", "revoked": ids}, reply=False)


def test_every_bad_byte_a_node_can_write_during_a_run_stops_nothing_and_loses_nothing(
    head: RedisHead, fleet: RoleStack, tmp_path: Path
) -> None:
    # Given a run of 300 prompts going through two GPUs
    node, producer = (redis.Redis.from_url(head.urls[user]) for user in (WORKER, "producer"))
    rows: list[object] = [prompt_files.as_messages(row) for row in prompt_files.questions(PROMPTS, "q")]
    data = prompt_files.write_jsonl(tmp_path / "prompts.jsonl", rows)
    fleet.enqueue(data, RUN, "--output", str(tmp_path / "out"))
    pids = [process.pid for process in [*fleet.generators, fleet.uploader] if process is not None]
    wait_until(
        lambda: RunLedger(producer, RUN).counts().staged > 0,
        timeout_s=FIRST_HAND_OVER_S,
        what="the first completion handed over",
    )

    # When a GPU node's password writes every bad byte it can, while the run goes on
    offer_queued_tasks_as_revoked(head.urls[WORKER], node)
    pushed = push_every_malformed_message(node)
    victim = "q-0"
    candidates = [f"q-{i}" for i in range(PROMPTS - 1, 0, -1)]  # any order: the longest known go first

    def bomb(one: str) -> bytes:
        return zstd_bomb(one, inflates_to_bytes=BOMB_INFLATES_TO_BYTES)

    forged = {
        "unreadable": forge_unstaged(
            node, producer, candidates, lambda _one: b"\x28\xb5\x2f\xfd not a whole frame"
        ),
        "bomb": forge_unstaged(node, producer, candidates, bomb),
        "another prompt's": forge_unstaged(
            node, producer, candidates, lambda _one: encode_blob(completion(victim))
        ),
        "never enqueued": forge_staged(node, NEVER_ENQUEUED, encode_blob(completion(NEVER_ENQUEUED))),
    }
    letter = DeadLetter(prompt_id=victim, row=1, reason="poison_prompt", error="forged", attempts=1)
    wrong_field = not_yet_staged(producer, candidates)[0]
    node.hsetnx(RunKeys(RUN).dead, wrong_field, msgspec.json.encode(letter))
    node.zadd(RunKeys(RUN).dead_pending, {wrong_field: redis_now_s(node)})

    # Then the same processes finish the run, every real prompt committed exactly once
    assert all(forged.values()), forged
    fleet.wait_finished(RUN, timeout_s=FINISH_S)
    assert [process.pid for process in [*fleet.generators, fleet.uploader] if process is not None] == pids
    assert all(process.alive() for process in fleet.generators)
    verified = fleet.verify(RUN)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    committed = [row["prompt_id"] for row in fleet.committed_rows(RUN)]
    assert sorted(committed) == sorted(f"q-{i}" for i in range(PROMPTS))
    # And status, parked and verify name what was parked and quarantined
    status = fleet.producer("status", "--run", RUN, COLUMNS=WIDE_TERMINAL).stdout
    assert "malformed messages parked, never delivered" in status, status
    assert "quarantined" in status, status
    assert "not_json" in fleet.producer("parked", "--limit", str(pushed + 10)).stdout
    for reason in ("unreadable", "over_limit", "prompt_id_mismatch", "not_accepted"):
        assert reason in verified.stdout, verified.stdout
