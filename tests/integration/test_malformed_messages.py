"""No message stops a consumer, and no node unrevokes work: on the fleet's Redis with the deploy ACL, a GPU
node's password pushes every kind of malformed message to the queues, the remote-control and event channels
and kombu's unacked hash; the generate worker, the uploader and Flower stay up (the same processes), every
message is parked with its reason and queue (Flower, which may not park, drops what it hears), `status` and
`parked` name them, and the next run is committed whole. A `hello` carrying a queued task's id revokes it
nowhere, and the answers to questions hold no password."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.transport import redis as kombu_redis

from core.records import SamplingSettings
from core.run_settings.model import RunSettings
from devstack.local_stack import flower_process, free_port, http_ok, wait_until
from producer.enqueue.enqueuer import Enqueuer, pin_settings
from tests.support import prompt_files
from tests.support.malformed_messages import (
    flush_item,
    generate_item,
    malformed_generate_items,
    malformed_upload_items,
)
from tests.support.records import prompt
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
from workers.broker.parked_messages import park, parked_counts, parked_message, recent_parked
from workers.errors import MalformedMessage
from workers.record.output_pin import write_run_json
from workers.record.storage import open_store
from workers.state.keys import PARKED_COUNTS_KEY, PARKED_MESSAGES_KEY, RunKeys
from workers.state.ledger import RunLedger
from workers.state.queues import (
    GENERATE_QUEUE,
    GENERATE_TASK,
    KOMBU_UNACKED_INDEX_KEY,
    KOMBU_UNACKED_KEY,
    UPLOAD_QUEUE,
)

pytestmark = pytest.mark.integration

SPEEDUP = 400.0
NODE, OTHER_NODE = GPU_NODES
WORKER, OTHER_WORKER = node_user(NODE), node_user(OTHER_NODE)
RUN, BATCH = "after-the-junk", "0123456789abcdef"
QUEUED_TASK_ID = "0f0f0f0f-0000-4000-8000-000000000000"
PARKED_S = 30.0
KOMBU_UNACKED_MUTEX_KEY = kombu_redis.Channel.unacked_mutex_key
UNACKED_SWEEP_S = kombu_redis.Channel.unacked_mutex_expire + PARKED_S
FINISH_S = 60.0
QUESTION_TIMEOUT_S = 2.0
WIDE_TERMINAL = "400"  # status prints its warning on one line
RESTORE_INTERVAL_S = "1"  # kombu's sweep of unacked messages (10 s by default) finds the forged one soon
BROADCAST_CHANNEL = "/0.celery.pidbox"
EVENT_CHANNEL = "/0.celeryev/worker.heartbeat"
WORKERS = 2  # the generate worker and the uploader
SUBSCRIBERS = WORKERS  # each parks what it hears; Flower drops it
REFUSED_QUESTIONS = ("objgraph", "memsample", "memdump")
ITEM = generate_item(RUN, BATCH)
ON_GENERATE = malformed_generate_items(ITEM, expired_task_id=QUEUED_TASK_ID)
ON_UPLOAD = malformed_upload_items(ITEM, flush_item(RUN))
HEARD = [(BROADCAST_CHANNEL, b"[]", "celery.pidbox"), (EVENT_CHANNEL, b"5", "celeryev")]


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisHead]:
    with redis_head_running(tmp_path_factory.mktemp("redis-head")) as head:
        yield head


@pytest.fixture(scope="module")
def stack(head: RedisHead, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoleStack]:
    """One generate worker (as this node's user) and the uploader, with mingle and gossip as under systemd."""
    restore_soon = {"DRAFTGEN_UNACKED_RESTORE_INTERVAL_S": RESTORE_INTERVAL_S}
    with simulators_running(1, speedup=SPEEDUP) as sims:
        log_dir = tmp_path_factory.mktemp("logs")
        with node_stack_running(head, log_dir, sims, extra_env=restore_soon, malformed_sent=True) as stack:
            yield stack


def client_of(head: RedisHead, user: str) -> redis.Redis:
    return redis.Redis.from_url(head.urls[user])


def finished(stack: RoleStack, run: str) -> bool:
    counts = RunLedger(redis.Redis.from_url(stack.redis_url), run).counts()
    return counts.enqueued > 0 and counts.remaining == 0 and counts.staged == counts.dead_pending == 0


def listening_to_events(admin: redis.Redis, user: str) -> bool:
    """Whether a connection of `user` holds a pattern subscription (Flower: its events, after it serves)."""
    return any(client["user"] == user and int(client["psub"]) > 0 for client in admin.client_list())


def parked_by_queue(admin: redis.Redis) -> Counter[str]:
    by_queue: Counter[str] = Counter()
    for count in parked_counts(admin):
        by_queue[count.queue] += count.count
    return by_queue


def wait_for_parked(admin: redis.Redis, expected: Counter[str], timeout_s: float) -> None:
    try:
        wait_until(
            lambda: parked_by_queue(admin) == expected, timeout_s=timeout_s, what="every message parked"
        )
    except TimeoutError as error:
        mutex_ttl_s = admin.ttl(KOMBU_UNACKED_MUTEX_KEY)
        raise AssertionError(
            f"{error}: parked {parked_counts(admin)}; kombu's sweep lock expires in {mutex_ttl_s} s"
        ) from error


@pytest.mark.timeout(UNACKED_SWEEP_S + FINISH_S + PARKED_S)
def test_no_malformed_message_a_node_can_push_stops_a_consumer_each_is_parked_and_work_goes_on(
    head: RedisHead, stack: RoleStack, tmp_path: Path, log_dir: Path
) -> None:
    # Given the generate worker, the uploader and Flower, each as its own user
    admin, node = client_of(head, "admin"), client_of(head, WORKER)
    admin.delete(PARKED_MESSAGES_KEY, PARKED_COUNTS_KEY)
    flower_port = free_port()
    flower = flower_process(flower_port, stack.env(DRAFTGEN_REDIS_URL=head.urls["flower"]), log_dir)
    flower.start().wait_ready(lambda: http_ok(f"http://127.0.0.1:{flower_port}/healthcheck"))
    flower.wait_ready(lambda: listening_to_events(admin, "flower"))
    generator, uploader = stack.generators[0], stack.uploader
    assert uploader is not None
    pids = (generator.pid, uploader.pid, flower.pid)
    try:
        # When a GPU node's password pushes every kind of malformed message, all at once
        for raw, _ in ON_GENERATE:
            node.lpush(GENERATE_QUEUE, raw)
        for raw, _ in ON_UPLOAD:
            node.lpush(UPLOAD_QUEUE, raw)
        for channel, raw, _ in HEARD:
            node.publish(channel, raw)
        node.hset(KOMBU_UNACKED_KEY, "forged", b"x")
        node.zadd(KOMBU_UNACKED_INDEX_KEY, {"forged": 0})
        expected = Counter(
            {
                GENERATE_QUEUE: len(ON_GENERATE),
                UPLOAD_QUEUE: len(ON_UPLOAD),
                **{family: SUBSCRIBERS for _, _, family in HEARD},
                "unacked": 1,
            }
        )
        # (the forged unacked entry waits for kombu's sweep, which every consumer runs under one lock: a
        # sweep cut off on a loaded machine leaves it held until it expires, 5 minutes)
        wait_for_parked(admin, expected, timeout_s=UNACKED_SWEEP_S)

        # Then every message is parked with its reason and the queue it came from
        reasons = {(count.queue, count.reason): count.count for count in parked_counts(admin)}
        pushed = ((GENERATE_QUEUE, ON_GENERATE), (UPLOAD_QUEUE, ON_UPLOAD))
        wanted = Counter((queue, reason) for queue, kinds in pushed for _, reason in kinds)
        assert all(reasons[key] == count for key, count in wanted.items()), reasons
        assert reasons[("unacked", "bad_unacked_entry")] == 1
        records = recent_parked(admin, limit=100)
        assert {record.size for record in records} >= {1, 2} and all(len(r.preview) <= 1024 for r in records)
        # And no consumer stopped: the same processes run, Flower dropped what it heard and serves
        assert (generator.pid, uploader.pid, flower.pid) == pids
        assert generator.alive() and uploader.alive() and flower.alive()
        assert "dropped a malformed message" in flower.log_text()
        assert http_ok(f"http://127.0.0.1:{flower_port}/healthcheck")
        # And the next run is committed whole, by the same processes
        rows: list[object] = [prompt_files.as_messages(row) for row in prompt_files.questions(8, "m")]
        stack.enqueue(
            prompt_files.write_jsonl(tmp_path / "m.jsonl", rows), RUN, "--output", str(tmp_path / "out")
        )
        wait_until(
            lambda: finished(stack, RUN), timeout_s=FINISH_S, what="the run after the malformed messages"
        )
        assert stack.verify(RUN).returncode == 0
        assert (generator.pid, uploader.pid) == pids[:2]
        # And status and parked name them
        total = sum(expected.values())
        status = stack.producer("status", "--run", RUN, COLUMNS=WIDE_TERMINAL)
        assert f"WARNING: {total} malformed messages parked, never delivered (" in status.stdout
        assert "generate not_json 1," in status.stdout and "celery.pidbox not_an_object 2," in status.stdout
        listed = stack.producer("parked", "--limit", "100")
        assert "generate  bad_arguments: run name '../etc' must start with a letter" in listed.stdout
    finally:
        flower.stop()


def enqueue_without_a_message(producer: redis.Redis, run: str, output: Path) -> str:
    """A run of one batch, enqueued as `enqueue` does but not published: its one batch id."""
    settings = RunSettings(run=run, sampling=SamplingSettings(), output=output.as_uri())
    store = open_store(settings.output)
    write_run_json(store, settings)
    batches: list[str] = []
    enqueuer = Enqueuer(
        producer,
        pin_settings(producer, settings),
        lambda _run, ids: batches.extend(ids),
        source="t",
        store=store,
    )
    enqueuer.enqueue(prompt(f"h{number}") for number in range(4))
    [batch] = batches
    return batch


def test_a_hello_carrying_a_queued_task_s_id_revokes_it_nowhere_and_it_runs(
    head: RedisHead, stack: RoleStack, tmp_path: Path
) -> None:
    # Given another node's password, which reads the id of a task about to be queued
    other_node = sending_app(BrokerOptions(head.urls[OTHER_WORKER], 7200, 10))
    # When it broadcasts the question a starting worker asks, offering that id as revoked
    inspect = other_node.control.inspect(timeout=QUESTION_TIMEOUT_S, limit=WORKERS)
    answers = inspect.hello("evil@other-node", [QUEUED_TASK_ID]) or {}
    # Then every worker answers with no revoked id, and none holds it as revoked
    assert len(answers) == WORKERS and all(answer["revoked"] == [] for answer in answers.values()), answers
    revoked = inspect.revoked() or {}
    assert len(revoked) == WORKERS and all(ids == [] for ids in revoked.values()), revoked
    # And the task with that id runs: its batch is generated and committed
    run = "hello-revokes-nothing"
    batch = enqueue_without_a_message(client_of(head, "producer"), run, tmp_path / "out")
    producer = sending_app(BrokerOptions(stack.redis_url, 7200, 10))
    producer.send_task(GENERATE_TASK, args=[run, batch], task_id=QUEUED_TASK_ID)
    wait_until(lambda: finished(stack, run), timeout_s=FINISH_S, what="the batch of the offered task id")
    assert f"[{QUEUED_TASK_ID}] succeeded" in stack.generators[0].log_text()


def test_the_questions_still_answered_tell_no_password_and_the_others_are_refused(
    head: RedisHead, stack: RoleStack
) -> None:
    other_node = sending_app(BrokerOptions(head.urls[OTHER_WORKER], 7200, 10))
    inspect = other_node.control.inspect(timeout=QUESTION_TIMEOUT_S, limit=WORKERS)
    answers: list[Any] = [inspect.stats(), inspect.conf(with_defaults=True), inspect.report()]
    passwords = [url.split("@")[0].rsplit(":", 1)[1] for url in head.urls.values()]
    assert all(answer for answer in answers)
    assert not [password for password in passwords if password in repr(answers)]
    for question in REFUSED_QUESTIONS:
        replies = inspect._request(question) or {}
        assert replies and all("refused" in reply["error"] for reply in replies.values()), (question, replies)


def test_a_node_s_user_may_park_a_message_and_flower_s_may_not(head: RedisHead) -> None:
    record = parked_message(b"x", GENERATE_QUEUE, MalformedMessage("not_json", "x"), at=time.time())
    admin = client_of(head, "admin")
    admin.acl_log_reset()
    park(client_of(head, WORKER), record)
    park(client_of(head, "uploader"), record)
    assert admin.acl_log() == []
    with pytest.raises(redis.exceptions.ResponseError):
        park(client_of(head, "flower"), record)


@pytest.mark.parametrize(
    "command",
    [
        ("DEL", PARKED_MESSAGES_KEY),
        ("DEL", PARKED_COUNTS_KEY),
        ("HSET", PARKED_COUNTS_KEY, "generate|not_json", "0"),
        ("SET", PARKED_MESSAGES_KEY, "x"),
        ("LPUSH", RunKeys(RUN).done, "x"),  # the parked list's grant reaches no other key
    ],
    ids=" ".join,
)
def test_a_node_s_user_may_not_erase_the_parked_messages_nor_write_other_keys_with_that_grant(
    head: RedisHead, command: tuple[str, ...]
) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        client_of(head, WORKER).execute_command(*command)
