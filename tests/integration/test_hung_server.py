"""A server that hangs with `/health` still 200: the generate worker notices by token progress, puts its
work back in the queue, restarts the server with its restart command, and the run completes, nothing lost.
A single request the server leaves silent while it streams the others is cut and tried again, and its
prompt committed once.

Real processes throughout: redis-server, a simulated GPU over HTTP, a generate worker and an uploader.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devstack.local_stack import wait_until
from inference.errors import InferenceRejected
from inference.server_probe import ServerProbe
from inference.simulator import SimulatorProcess
from tests.support import prompt_files
from tests.support.stack import Stack, deployed_server, simulators
from workers.state.ledger import RunLedger
from workers.state.queues import GENERATE_QUEUE, KOMBU_UNACKED_KEY

pytestmark = pytest.mark.integration

SPEEDUP = 20.0  # the run lasts seconds, so the hang lands in the middle of it
PROMPTS = 100
BATCH_SIZE = "10"
HANG_AFTER_COMPLETIONS = 20
STALL_S = "3"  # the per-step counter moves every decode step; completions come every ~0.1 s with 30 running
POLL_S = "0.25"
GATE_TIMEOUT_S = 60.0
WAIT_S = 30.0
# 2 s, not the default 30 s, so that the test takes seconds: at speedup 20 every request here streams a
# chunk every 10-20 ms, so 2 s of silence is still a hundred chunk intervals.
SILENCE_LIMIT_S = 2.0
LATENESS_S = 2.0  # how late past the limit the cut may come on a busy test machine
SILENT_PROMPT = 7

RESTART_SCRIPT = '''\
"""Stands in for `systemctl restart`: once the test opens the gate, it clears the simulator's hang."""
import json
import pathlib
import sys
import time
import urllib.request

gate, url, timeout_s = pathlib.Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + timeout_s
while not gate.exists():
    if time.monotonic() > deadline:
        sys.exit("the test never opened the gate")
    time.sleep(0.05)
request = urllib.request.Request(
    url + "/admin/faults",
    data=json.dumps({"server_hang": False}).encode(),
    method="POST",
    headers={"Content-Type": "application/json"},
)
with urllib.request.urlopen(request, timeout=10) as reply:
    print("server restarted, faults now", reply.read().decode())
'''


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    [running] = simulators(1, speedup=SPEEDUP, enable_metrics=True, request_log_size=20_000)
    yield running
    running.stop()


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """The file whose creation lets the restart command un-hang the server."""
    return tmp_path / "restart-gate"


@pytest.fixture
def stack(
    redis_url: str, log_dir: Path, sim: SimulatorProcess, gate: Path, tmp_path: Path
) -> Iterator[Stack]:
    script = tmp_path / "restart_server.py"
    script.write_text(RESTART_SCRIPT)
    restart = shlex.join([sys.executable, str(script), str(gate), sim.url, str(GATE_TIMEOUT_S)])
    running = Stack(
        redis_url,
        log_dir,
        [sim],
        extra_env={
            "DRAFTGEN_LIVENESS_POLL_S": POLL_S,
            "DRAFTGEN_LIVENESS_STALL_S": STALL_S,
            "DRAFTGEN_LIVENESS_COMPLETION_STALL_S": STALL_S,
            "DRAFTGEN_SERVER_RESTART_COMMAND": restart,
        },
    ).start()
    yield running
    running.stop()


@pytest.fixture
def silence_stack(redis_url: str, log_dir: Path, sim: SimulatorProcess) -> Iterator[Stack]:
    running = Stack(redis_url, log_dir, [sim], extra_env={"DRAFTGEN_SILENCE_LIMIT_S": str(SILENCE_LIMIT_S)})
    yield running.start()
    running.stop()


def handed_over(ledger: RunLedger) -> int:
    counts = ledger.counts()
    return counts.staged + counts.done


def generate_messages_held(client: redis.Redis) -> int:
    """Generate messages delivered to a worker and not yet acknowledged."""
    held = (json.loads(raw) for raw in client.hvals(KOMBU_UNACKED_KEY))
    return sum(1 for _message, _exchange, routing_key in held if routing_key == GENERATE_QUEUE)


def test_a_hung_server_is_noticed_its_work_requeued_and_the_run_completes_after_a_restart(
    stack: Stack, sim: SimulatorProcess, gate: Path, tmp_path: Path
) -> None:
    # Given a run of 100 prompts in progress on one GPU
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(PROMPTS, "hang")]
    )
    run = "liveness"
    stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--batch-size", BATCH_SIZE)
    client = redis.Redis.from_url(stack.redis_url)
    ledger = RunLedger(client, run)
    wait_until(
        lambda: handed_over(ledger) >= HANG_AFTER_COMPLETIONS, timeout_s=WAIT_S, what="the run under way"
    )
    # When the server hangs: /health still answers 200, but no token is produced
    sim.admin.set_faults(server_hang=True)
    assert sim.admin.health_status() == 200
    assert handed_over(ledger) < PROMPTS, "the hang came too late to land mid-run"
    # Then the worker notices by token progress and stops taking batches
    worker = stack.generators[0]
    worker.wait_for_log(f"server {sim.url} is hung", timeout_s=WAIT_S)
    worker.wait_for_log(f"Canceling queue {GENERATE_QUEUE}", timeout_s=WAIT_S)
    # And the batches it held go back to the queue at once, with their abandoned prompts still pending
    wait_until(
        lambda: generate_messages_held(client) == 0, timeout_s=WAIT_S, what="every generate message requeued"
    )
    worker.wait_for_log("abandoned: server", timeout_s=WAIT_S)  # logged as its batch is handed back
    assert ledger.counts().remaining > 0
    # When its restart command brings the server back
    gate.touch()
    # Then the worker resumes taking batches, the run completes, and verify passes
    worker.wait_for_log("server restarted, faults now", timeout_s=WAIT_S)
    worker.wait_for_log(f"server {sim.url} generates again", timeout_s=WAIT_S)
    stack.wait_finished(run, timeout_s=WAIT_S)
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout + result.stderr
    # And nothing was lost to the hang: every prompt committed, none dead-lettered
    counts = ledger.counts()
    assert (counts.done, counts.dead) == (PROMPTS, 0)


def test_a_simulator_that_has_served_nothing_but_its_warm_up_reads_as_idle_with_its_step_counter(
    sim: SimulatorProcess,
) -> None:
    """SGLang creates each `realtime_tokens_total` series at its first non-zero increment: its start-up
    warm-up request does, as the simulator's (without one, `--skip-server-warmup`, the series appear with
    the first request: tests/simulator/test_simulator_faults.py)."""
    snapshot = ServerProbe(sim.url).metrics()
    assert not snapshot.busy
    assert snapshot.has_step_counter


def test_a_server_without_metrics_refuses_the_scrape_with_404() -> None:
    with (
        SimulatorProcess(deployed_server(enable_metrics=False)) as plain,
        pytest.raises(InferenceRejected) as refused,
    ):
        ServerProbe(plain.url).metrics()
    assert refused.value.status == 404


def test_a_request_left_silent_while_others_stream_is_cut_and_its_prompt_committed_once(
    silence_stack: Stack, sim: SimulatorProcess, tmp_path: Path
) -> None:
    # Given a run whose prompt 7 the server accepts and then leaves silent, the first time it comes
    rows = prompt_files.questions(PROMPTS, "silent")
    poison = f"Question silent {SILENT_PROMPT}:"
    sim.admin.set_faults(prompt_faults={poison: {"fault": "hang", "times": 1}})
    data = prompt_files.write_jsonl(tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in rows])
    run = "silence"
    silence_stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--batch-size", BATCH_SIZE)
    # When the run completes
    silence_stack.wait_finished(run, timeout_s=WAIT_S)
    result = silence_stack.verify(run)
    assert result.returncode == 0, result.stdout + result.stderr
    # Then every prompt is committed once, the silent one on its second attempt, none dead-lettered
    committed = silence_stack.committed_rows(run)
    attempts = {str(row["prompt_id"]): row["attempt"] for row in committed}
    assert len(committed) == len(attempts) == PROMPTS
    assert attempts.pop(f"silent-{SILENT_PROMPT}") == 2 and set(attempts.values()) == {1}
    assert RunLedger(redis.Redis.from_url(silence_stack.redis_url), run).counts().dead == 0
    # And the worker cut it within the silence limit of its last chunk, and the server freed its slot
    first = min(
        (r for r in sim.admin.requests() if r.rid.startswith(f"{run}:silent-{SILENT_PROMPT}:")),
        key=lambda r: r.received_at,
    )
    assert (first.status, first.finish_reason) == ("hung", "abort")
    assert first.first_token_at is not None and first.finished_at is not None
    assert SILENCE_LIMIT_S <= first.finished_at - first.first_token_at < SILENCE_LIMIT_S + LATENESS_S
    assert "taken for hung" in silence_stack.generators[0].log_text()
