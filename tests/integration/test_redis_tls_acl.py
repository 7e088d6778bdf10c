"""The fleet's Redis as deploy/multi-node.md configures it: TLS only (rediss://, the server's certificate
checked against a test CA) and one ACL user per role from deploy/redis-users.acl, the generate workers'
one per GPU node. The whole pipeline runs with each process as its own user, and no user is refused
anything it needs, nor is a GPU node's user refused any step its workers take; a GPU node's user is
refused what it must not do: run Lua of its own, load functions, mark prompts done, delete or consume the
queues, take staged work away, lift a pause, or touch another node's seats, heartbeats and exit notes."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from core.records import DeadLetter, DeadLetterReason, Quality, SamplingSettings
from core.run_settings.model import QualityGate, RunSettings
from devstack.local_stack import (
    PROJECT_ROOT,
    celery_command,
    celery_worker,
    flower_process,
    free_port,
    http_ok,
    wait_until,
)
from inference.simulator import SimulatorProcess
from producer.enqueue.enqueuer import Enqueuer
from tests.support import prompt_files
from tests.support.dispatch import RecordingDispatcher
from tests.support.records import completion, prompt
from tests.support.redis_head import GPU_NODES, RedisHead, RoleStack, node_user
from tests.support.stack import simulators
from workers.bootsteps.seating import EXIT_SEAT_REFUSED
from workers.errors import SeatRefused
from workers.generate.quality_gate import check_quality_gate
from workers.recovery.leases import Acquired, LeaseKeeper, finish_batch
from workers.recovery.reconciler import Reconciler, ReconcileSettings
from workers.recovery.seat import Seat
from workers.state.control import PAUSED_BY_GATE, pause, pause_state
from workers.state.exit_notes import leave_exit_note
from workers.state.keys import RunKeys, seat_channel, seat_key, worker_exit_note_key, worker_heartbeat_key
from workers.state.ledger import RunLedger
from workers.state.poison import Suspicion
from workers.state.queues import GENERATE_QUEUE, GENERATE_TASK, UPLOAD_QUEUE

pytestmark = pytest.mark.integration

SPEEDUP = 400.0
PROMPTS = 64
RUN = "tls-acl"
FINISH_S = 60.0
BROKER_TAB_TIMEOUT_S = 30.0
VERIFIED = "OK: every prompt committed exactly once or dead-lettered"
# redis-py names itself with CLIENT SETINFO on connect and ignores a refusal (Redis 7.2 and later log it).
IGNORED_REFUSALS = frozenset({"client|setinfo"})
STEPS_RUN = "worker-steps"
NODE, OTHER_NODE = GPU_NODES  # the GPU node whose workers run here, and another one
WORKER, OTHER_WORKER = node_user(NODE), node_user(OTHER_NODE)
LABEL = f"{NODE}/gpu0"
SEAT_REFUSED_EXIT_S = 60.0
SUBSCRIBE_ANSWER_S = 2.0
ATTACKER_TOKEN = "a" * 32  # a seat token of the attacker's own, as uuid4().hex has
LONG_S = 3600.0
HEARTBEAT_TTL_S = 30


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
    """Workers (labelled with NODE) and the uploader as their own users, the commands as the producer's."""
    urls = head.urls
    worker, uploader = urls[WORKER], urls["uploader"]
    return RoleStack(
        urls["producer"], log_dir, sims, worker_url=worker, worker_host=NODE, uploader_url=uploader
    )


def refusals(admin: redis.Redis) -> list[dict[str, Any]]:
    """ACL LOG: every command, key or channel a user was refused."""
    return [entry for entry in admin.acl_log(count=1000) if entry["object"] not in IGNORED_REFUSALS]


def broker_tab(port: int) -> str:
    """Flower's Broker page: it lists the queues only when its own Redis client got through."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/broker", timeout=BROKER_TAB_TIMEOUT_S) as page:
        return str(page.read().decode())


def refused(client: redis.Redis, command: tuple[str, ...]) -> bool:
    """Whether Redis refuses the client's user the command (NOPERM)."""
    try:
        client.execute_command(*command)
    except redis.exceptions.NoPermissionError:
        return True
    return False


def subscribe(client: redis.Redis, channel: str) -> None:
    """SUBSCRIBE, reading Redis's answer (a refusal raises NoPermissionError)."""
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(channel)
        pubsub.get_message(timeout=SUBSCRIBE_ANSWER_S)
    finally:
        pubsub.close()


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
        admin = client_of(head, "admin")
        assert admin.function_list() == []  # the workers started before anything loaded the functions
        # When the producer's user enqueues a run (loading the functions) and it finishes
        rows: list[object] = [prompt_files.as_messages(row) for row in prompt_files.questions(PROMPTS, "t")]
        data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
        output = stack.enqueue(data, RUN, "--output", str(tmp_path / "out"))
        assert f"new                 {PROMPTS} prompts" in output
        wait_until(lambda: finished(stack, RUN) or bool(refusals(admin)), timeout_s=FINISH_S, what=RUN)
        # Then no user was refused anything on the way, and every prompt is committed exactly once
        assert refusals(admin) == []
        verified = stack.verify(RUN)
        assert verified.returncode == 0 and VERIFIED in verified.stdout, verified.stdout + verified.stderr
        # And Flower's Broker tab reads the queues over the same TLS (its own Redis client)
        broker_page = broker_tab(flower_port)
        assert "generate" in broker_page and "upload" in broker_page
        # And stopped as systemd stops them (SIGTERM), they are refused nothing either
        for process in [*stack.generators, stack.uploader, flower]:
            if process is not None:
                process.stop()
        assert refusals(admin) == []
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
        env = {**os.environ, **stack.env(DRAFTGEN_REDIS_URL=urls[WORKER])}
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
    assert refused(client_of(head, WORKER), command)


def test_a_worker_s_user_cannot_redirect_a_run_s_output_nor_mark_a_prompt_committed(head: RedisHead) -> None:
    worker = client_of(head, WORKER)
    keys = RunKeys(RUN)
    worker.get(keys.settings)  # reading is allowed: a worker needs the run's sampling
    for key in (keys.settings, keys.manifest, keys.next_part):
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.set(key, b"{}")


def test_a_worker_s_user_may_take_every_step_a_worker_takes(head: RedisHead, tmp_path: Path) -> None:
    # Given a run of two batches, enqueued by the producer's user
    producer, worker, admin = (client_of(head, user) for user in ("producer", WORKER, "admin"))
    admin.acl_log_reset()
    settings = RunSettings(
        run=STEPS_RUN, sampling=SamplingSettings(), output=(tmp_path / "out").as_uri(), batch_size=2
    )
    batches: list[str] = []
    Enqueuer(producer, settings, lambda _run, ids: batches.extend(ids), source="test").enqueue(
        prompt(f"p{i}") for i in range(4)
    )
    producer.sadd("draftgen:runs", STEPS_RUN)
    # When a worker's user takes its seat, leases, renews, hands over, strikes, dead-letters, keeps turns,
    # finishes a batch and hands another back, reconciles, pauses the run by its gate, beats and leaves
    seat = Seat(worker, LABEL, on_lost=lambda reason: None)
    taken = seat.take()
    keeper = LeaseKeeper(worker, worker=LABEL, seat=taken.token, ttl_s=LONG_S)
    (acquired, first), (_, second) = (
        keeper.acquire(STEPS_RUN, batches[0]),
        keeper.acquire(STEPS_RUN, batches[1]),
    )
    assert acquired is Acquired.ACQUIRED and keeper.renew() == []
    ledger = RunLedger(worker, STEPS_RUN)
    assert ledger.keep_turns("p0", [completion("p0").as_turn()])
    assert ledger.stage(completion("p0"))
    ledger.strike("p1", Suspicion(life=f"{LABEL}#1.1", cause="dropped", with_server=True, at=1.7e9))
    letter = DeadLetter(
        prompt_id="p1", row=1, reason=DeadLetterReason.REJECTED_BY_SERVER, error="400", attempts=1
    )
    assert ledger.dead_letter(letter)
    assert finish_batch(worker, STEPS_RUN, batches[0], ["p0", "p1"]) == []
    assert keeper.release(second, delay_s=0.0)
    reconciler = Reconciler(worker, RecordingDispatcher(), ReconcileSettings(upload_max_age_s=LONG_S))
    reconciler.reconcile_all()
    reconciler.take_back_seat(taken, LABEL)
    eager_gate = QualityGate(min_completions=1, max_empty_answer_rate=0.0)
    empty = msgspec.structs.replace(completion("p2", content=""), quality=Quality.EMPTY_ANSWER)
    keeper.acquire(STEPS_RUN, batches[1])
    assert ledger.stage(empty) and check_quality_gate(worker, STEPS_RUN, eager_gate) is not None
    worker.set(worker_heartbeat_key(LABEL), b"{}", ex=HEARTBEAT_TTL_S)
    worker.delete(worker_heartbeat_key(LABEL))
    leave_exit_note(worker, LABEL, "stopped consuming")
    seat.release()
    # Then it was refused nothing
    assert first.batch_id == batches[0] and pause_state(producer, STEPS_RUN) is not None
    assert refusals(admin) == []


@pytest.mark.parametrize(
    "command",
    [
        ("SET", seat_key(LABEL), ATTACKER_TOKEN),  # the seat taken: its worker stops itself
        ("DEL", seat_key(LABEL)),
        ("SET", worker_heartbeat_key(LABEL), "{}"),  # a wrong heartbeat in `status`
        ("DEL", worker_heartbeat_key(LABEL)),
        ("SET", worker_exit_note_key(LABEL), "stopped consuming"),  # a wrong reason in `status`
    ],
    ids=lambda command: f"{command[0]} {command[1]}",
)
def test_another_gpu_node_s_user_may_not_write_this_node_s_seat_heartbeat_or_exit_note(
    head: RedisHead, command: tuple[str, ...]
) -> None:
    assert refused(client_of(head, OTHER_WORKER), command)


def test_another_gpu_node_s_user_may_not_hold_a_subscription_on_this_node_s_seat_channel(
    head: RedisHead,
) -> None:
    # (a subscriber there makes a seat look held: this node's restarted worker would be refused its seat)
    with pytest.raises(redis.exceptions.NoPermissionError):
        subscribe(client_of(head, OTHER_WORKER), seat_channel(LABEL, ATTACKER_TOKEN))


def test_another_gpu_node_s_password_cannot_stop_this_node_s_worker(
    head: RedisHead, sims: list[SimulatorProcess], tmp_path: Path, log_dir: Path
) -> None:
    # Given this node's generate worker, seated on its GPU as this node's user
    admin, other_node = client_of(head, "admin"), client_of(head, OTHER_WORKER)
    stack = role_stack(head, log_dir, sims)
    try:
        stack.start()
        generator = stack.generators[0]
        holder = admin.get(seat_key(LABEL))
        assert holder is not None
        # When another node's password tries to take its seat, as a worker would or key by key
        with pytest.raises(SeatRefused):
            Seat(other_node, LABEL, on_lost=lambda reason: None).take()
        with pytest.raises(redis.exceptions.NoPermissionError):
            subscribe(other_node, seat_channel(LABEL, ATTACKER_TOKEN))
        with pytest.raises(redis.exceptions.NoPermissionError):
            other_node.set(seat_key(LABEL), ATTACKER_TOKEN)
        # Then the seat is still its worker's, and the worker keeps consuming: a run enqueued now is
        # committed whole
        assert admin.get(seat_key(LABEL)) == holder
        rows: list[object] = [prompt_files.as_messages(row) for row in prompt_files.questions(16, "s")]
        data = prompt_files.write_jsonl(tmp_path / "s.jsonl", rows)
        stack.enqueue(data, "tls-seats", "--output", str(tmp_path / "out"))
        wait_until(
            lambda: finished(stack, "tls-seats"), timeout_s=FINISH_S, what="the run after the attempts"
        )
        assert generator.alive() and stack.verify("tls-seats").returncode == 0
    finally:
        stack.stop()


def test_a_worker_logged_in_as_another_node_s_user_stops_at_start_naming_the_env_file_it_needs(
    head: RedisHead, sims: list[SimulatorProcess], log_dir: Path
) -> None:
    # Given a generate worker labelled with this node's host, but holding the other node's env file
    stack = role_stack(head, log_dir, sims)
    env = stack.env(
        DRAFTGEN_REDIS_URL=head.urls[OTHER_WORKER],
        DRAFTGEN_SERVER_URL=sims[0].url,
        DRAFTGEN_GPU="0",
        DRAFTGEN_HOSTNAME=NODE,
    )
    worker = celery_worker("gen-wrong-user", GENERATE_QUEUE, env, log_dir).start()
    try:
        assert worker.process is not None
        # When it starts, it stops at once, with the exit code systemd does not restart
        assert worker.process.wait(timeout=SEAT_REFUSED_EXIT_S) == EXIT_SEAT_REFUSED
        # And says in one line which user was refused which seat, and which env file it needs
        log = worker.log_text()
        [reason] = [line for line in log.splitlines() if "does not start" in line]
        assert f"Redis refused the seat of {LABEL} (NOPERM" in reason
        assert f"Redis user '{OTHER_WORKER}'" in reason and f"/etc/draftgen/redis-worker-{NODE}.env" in reason
        assert "Traceback" not in log
    finally:
        worker.stop()


@pytest.mark.parametrize(
    "command",
    [
        ("EVAL", "return redis.call('SADD', KEYS[1], 'p0')", "1", RunKeys(RUN).done),
        ("EVAL", "return 1", "0"),
        ("SCRIPT", "LOAD", "return 1"),
        ("FUNCTION", "LOAD", "#!lua name=mine\nredis.register_function('mine', function() return 1 end)"),
        ("FUNCTION", "DELETE", "draftgen"),
        ("FUNCTION", "FLUSH"),
    ],
    ids=lambda command: " ".join(command[:2]),
)
def test_a_worker_s_user_may_run_no_lua_of_its_own(head: RedisHead, command: tuple[str, ...]) -> None:
    assert refused(client_of(head, WORKER), command)


@pytest.mark.parametrize(
    "command",
    [
        ("SADD", RunKeys(RUN).done, "p0"),  # a prompt marked committed outside the commit
        ("DEL", GENERATE_QUEUE),
        ("DEL", UPLOAD_QUEUE),
        ("BRPOP", UPLOAD_QUEUE, "1"),  # the uploader's messages taken
        ("DEL", f"_kombu.binding.{GENERATE_QUEUE}"),  # its routing: what is published goes nowhere
        ("DEL", RunKeys(RUN).staged),  # completions handed over, lost before their commit
        ("HDEL", RunKeys(RUN).staged, "p0"),
        ("PEXPIRE", RunKeys(RUN).staged, "1"),
        ("SET", RunKeys(RUN).staged, "x"),
        ("DEL", RunKeys(RUN).dead),
        ("SET", RunKeys(RUN).paused, "{}"),  # a pause reworded
        ("DEL", RunKeys(RUN).paused),  # a pause lifted
        ("PEXPIRE", RunKeys(RUN).paused, "1"),
    ],
    ids=" ".join,
)
def test_a_worker_s_user_cannot_mark_prompts_done_delete_queues_or_work_nor_lift_a_pause(
    head: RedisHead, command: tuple[str, ...]
) -> None:
    assert refused(client_of(head, WORKER), command)


def test_a_worker_s_user_may_pause_a_run_but_not_change_its_pause(head: RedisHead) -> None:
    worker, producer = client_of(head, WORKER), client_of(head, "producer")
    run = "paused-by-a-gpu-node"
    assert pause(producer, run, "by hand")

    assert not pause(worker, run, "mostly empty answers", by=PAUSED_BY_GATE)

    state = pause_state(producer, run)
    assert state is not None and state.reason == "by hand"


def test_a_client_that_does_not_check_the_server_s_certificate_against_the_ca_is_refused(
    head: RedisHead,
) -> None:
    url = head.urls[WORKER].split("&ssl_ca_certs=")[0]  # the system's CAs: ours is not among them
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        redis.Redis.from_url(url).ping()


def test_the_default_user_is_off(head: RedisHead) -> None:
    url = head.urls[WORKER].replace(f"{WORKER}:", ":", 1)  # the worker's password, as the default user
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(url).ping()
