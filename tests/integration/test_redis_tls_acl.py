"""The fleet's Redis as deploy/multi-node.md configures it: TLS only (rediss://, the server's certificate
checked against a test CA) and one ACL user per role from deploy/redis-users.acl. The whole pipeline
runs with each process as its own user, and no user is refused anything it needs; a worker's user is
refused what it must not do."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from devstack.local_stack import PROJECT_ROOT, celery_command, flower_process, free_port, http_ok, wait_until
from inference.simulator import SimulatorProcess
from tests.support import prompt_files
from tests.support.redis_head import RedisHead, RoleStack, start_redis_head
from tests.support.stack import simulators
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE, GENERATE_TASK

pytestmark = pytest.mark.integration

SPEEDUP = 400.0
PROMPTS = 64
RUN = "tls-acl"
FINISH_S = 60.0
BROKER_TAB_TIMEOUT_S = 30.0
VERIFIED = "OK: every prompt committed exactly once or dead-lettered"
# redis-py names itself with CLIENT SETINFO on connect and ignores a refusal (Redis 7.2 and later log it).
IGNORED_REFUSALS = frozenset({"client|setinfo"})


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisHead]:
    root = tmp_path_factory.mktemp("redis-head")
    head = start_redis_head(root, root)
    yield head
    head.stop()


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimulatorProcess]]:
    started = simulators(1, speedup=SPEEDUP)
    yield started
    for sim in started:
        sim.stop()


def finished(stack: RoleStack, run: str) -> bool:
    counts = RunLedger(redis.Redis.from_url(stack.redis_url), run).counts()
    return counts.enqueued > 0 and counts.remaining == 0 and counts.staged == counts.dead_pending == 0


def client_of(head: RedisHead, user: str) -> redis.Redis:
    return redis.Redis.from_url(head.urls[user])


def role_stack(head: RedisHead, log_dir: Path, sims: list[SimulatorProcess]) -> RoleStack:
    """Workers and the uploader as their own users, the commands as the producer's."""
    urls = head.urls
    worker, uploader = urls["worker"], urls["uploader"]
    return RoleStack(urls["producer"], log_dir, sims, worker_url=worker, uploader_url=uploader)


def refusals(admin: redis.Redis) -> list[dict[str, Any]]:
    """ACL LOG: every command, key or channel a user was refused."""
    return [entry for entry in admin.acl_log(count=1000) if entry["object"] not in IGNORED_REFUSALS]


def broker_tab(port: int) -> str:
    """Flower's Broker page: it lists the queues only when its own Redis client got through."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/broker", timeout=BROKER_TAB_TIMEOUT_S) as page:
        return str(page.read().decode())


def test_the_pipeline_runs_over_tls_with_one_acl_user_per_role_and_none_is_refused_anything(
    head: RedisHead, sims: list[SimulatorProcess], tmp_path: Path, log_dir: Path
) -> None:
    # Given the workers, the uploader and Flower each connected as their own user, over TLS
    urls = head.urls
    stack = role_stack(head, log_dir, sims)
    flower_port = free_port()
    flower = flower_process(flower_port, stack.env(DRAFTGEN_REDIS_URL=urls["flower"]), log_dir)
    try:
        stack.start()
        flower.start().wait_ready(lambda: http_ok(f"http://127.0.0.1:{flower_port}/healthcheck"))
        # When the producer's user enqueues a run and it finishes
        rows: list[object] = [prompt_files.as_messages(row) for row in prompt_files.questions(PROMPTS, "t")]
        data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
        output = stack.enqueue(data, RUN, "--output", str(tmp_path / "out"))
        assert f"new                 {PROMPTS} prompts" in output
        admin = client_of(head, "admin")
        wait_until(lambda: finished(stack, RUN) or bool(refusals(admin)), timeout_s=FINISH_S, what=RUN)
        # Then no user was refused anything on the way, and every prompt is committed exactly once
        assert refusals(admin) == []
        verified = stack.verify(RUN)
        assert verified.returncode == 0 and VERIFIED in verified.stdout, verified.stdout + verified.stderr
        # And Flower's Broker tab reads the queues over the same TLS (its own Redis client)
        broker_page = broker_tab(flower_port)
        assert "generate" in broker_page and "upload" in broker_page
    finally:
        flower.stop()
        stack.stop()


def test_a_worker_s_user_can_neither_stop_nor_deafen_the_fleet_by_remote_control(
    head: RedisHead, sims: list[SimulatorProcess], tmp_path: Path, log_dir: Path
) -> None:
    # Given a generate worker and the uploader, each as its own user
    urls = head.urls
    stack = role_stack(head, log_dir, sims)
    try:
        stack.start()
        generator, uploader = stack.generators[0], stack.uploader
        assert uploader is not None
        host = socket.gethostname()
        # When a GPU node's password broadcasts what would stop or deafen the fleet
        attacks = [
            ("shutdown", "-d", f"{uploader.name}@{host}"),
            ("cancel_consumer", GENERATE_QUEUE, "-d", f"{generator.name}@{host}"),
            ("rate_limit", GENERATE_TASK, "1/h"),
            ("revoke", "0f0f0f0f-0000-4000-8000-000000000000"),
            ("shutdown",),
        ]
        env = {**os.environ, **stack.env(DRAFTGEN_REDIS_URL=urls["worker"])}
        for attack in attacks:
            sent = subprocess.run(
                celery_command("control", *attack), cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
            )
            said = sent.stdout + sent.stderr
            assert "refused" in said and "remote-control questions only" in said, (attack, said)
        # Then every worker is still up and consuming: a run enqueued now is committed whole
        assert generator.alive() and uploader.alive()
        rows: list[object] = [prompt_files.as_messages(row) for row in prompt_files.questions(16, "c")]
        data = prompt_files.write_jsonl(tmp_path / "c.jsonl", rows)
        stack.enqueue(data, "tls-control", "--output", str(tmp_path / "out"))
        wait_until(
            lambda: finished(stack, "tls-control"), timeout_s=FINISH_S, what="the run after the attacks"
        )
        assert stack.verify("tls-control").returncode == 0
    finally:
        stack.stop()


@pytest.mark.parametrize(
    "command",
    [("CONFIG", "GET", "*"), ("FLUSHALL",), ("FLUSHDB",), ("KEYS", "*"), ("ACL", "LIST"), ("SHUTDOWN",)],
    ids=lambda command: " ".join(command),
)
def test_a_worker_s_user_is_refused_admin_commands(head: RedisHead, command: tuple[str, ...]) -> None:
    worker = client_of(head, "worker")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.execute_command(*command)


def test_a_worker_s_user_cannot_redirect_a_run_s_output_nor_mark_a_prompt_committed(head: RedisHead) -> None:
    worker = client_of(head, "worker")
    keys = RunKeys(RUN)
    worker.get(keys.settings)  # reading is allowed: a worker needs the run's sampling
    for key in (keys.settings, keys.manifest, keys.next_part):
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.set(key, b"{}")


def test_a_client_that_does_not_check_the_server_s_certificate_against_the_ca_is_refused(
    head: RedisHead,
) -> None:
    url = head.urls["worker"].split("&ssl_ca_certs=")[0]  # the system's CAs: ours is not among them
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        redis.Redis.from_url(url).ping()


def test_the_default_user_is_off(head: RedisHead) -> None:
    url = head.urls["worker"].replace("worker:", ":", 1)  # the worker's password, as the default user
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(url).ping()
