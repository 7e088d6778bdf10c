"""Poison is proven, not guessed, on real processes: a prompt that wedges the whole server is isolated
within a bounded number of server restarts and dead-lettered with its trials, the rest of its batch
committed; an ordinary prompt on a flaky server, however its outages fall, and a prompt SGLang retracts
whenever it has company, are committed once and never dead-lettered.

Real processes throughout: redis-server, simulated GPUs kept up by a supervisor (a restart is a SIGKILL
and a new process on the same port, as `systemctl restart` under `Restart=always`), generate workers and
an uploader, with the README's defaults but where a test says why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from inference.simulator import SimulatorSettings
from tests.support import prompt_files
from tests.support.stack import README_WORKER_ENV, Stack
from tests.support.supervised_simulator import SupervisedSimulator
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.poison import (
    DEFAULT_CONVICTIONS_TO_DEAD,
    DEFAULT_SUSPICIONS_BEFORE_TRIAL,
    Evidence,
    Outcome,
    PoisonPolicy,
    TrialEnd,
    TrialEnded,
    decode_evidence,
)

pytestmark = pytest.mark.integration

POLICY = PoisonPolicy()
WEDGES = "POISON-WEDGE"
BATCH = 48  # the README's DRAFTGEN_MAX_IN_FLIGHT: the whole batch is in flight when the server wedges
WEDGE_SPEEDUP = 50.0  # a completion alone takes ~0.3 s, so trying the 47 innocent suspects takes seconds
# A wedge is noticed after the liveness stall window: 300 s by default, and the bound below is five of
# them. The simulator at this speedup moves its per-step counter every few milliseconds, so 3 s of no
# progress is a hang beyond doubt; a poll of 0.25 s times a wedge to within a quarter of a second.
WEDGE_LIVENESS = {"DRAFTGEN_LIVENESS_STALL_S": "3", "DRAFTGEN_LIVENESS_POLL_S": "0.25"}
RESTART_BOUND = DEFAULT_SUSPICIONS_BEFORE_TRIAL + DEFAULT_CONVICTIONS_TO_DEAD
WEDGE_FINISH_S = 480.0


def records(client: redis.Redis, run: str) -> dict[str, list[Evidence]]:
    raw = client.hgetall(RunKeys(run).strikes)
    return {key.decode(): decode_evidence(value, key.decode()) for key, value in raw.items()}


def trials(evidence: list[Evidence]) -> list[TrialEnded]:
    return [e for e in evidence if isinstance(e, TrialEnded)]


@pytest.fixture
def wedging_gpu(tmp_path: Path) -> Iterator[SupervisedSimulator]:
    settings = SimulatorSettings(
        speedup=WEDGE_SPEEDUP, enable_metrics=True, prompt_faults=json.dumps({WEDGES: "wedge"})
    )
    server = SupervisedSimulator(lambda _life: settings, tmp_path / "gpu0.pid").start()
    yield server
    server.stop()


def test_a_prompt_that_wedges_the_server_is_dead_lettered_within_five_restarts_and_its_batch_committed(
    redis_url: str, log_dir: Path, wedging_gpu: SupervisedSimulator, tmp_path: Path
) -> None:
    # Given one GPU whose server wedges (no token for anyone, /health 200) whenever one prompt reaches it,
    # that prompt in a batch of 48, and the liveness watch restarting the server on a hang
    stack = Stack(
        redis_url,
        log_dir,
        [wedging_gpu],  # type: ignore[list-item]  # a supervised simulator: the stack reads its url
        extra_env={
            **README_WORKER_ENV,
            **WEDGE_LIVENESS,
            "DRAFTGEN_SERVER_RESTART_COMMAND": wedging_gpu.restart_command(),
        },
    ).start()
    try:
        rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(BATCH, "wedge")]
        rows[17]["prompt"] = f"{rows[17]['prompt']} {WEDGES}"
        culprit = str(rows[17]["id"])
        data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
        run = "wedged"
        started = time.monotonic()
        stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--batch-size", str(BATCH))
        # When the run goes on by itself
        stack.wait_finished(run, timeout_s=WEDGE_FINISH_S)
        took_s = time.monotonic() - started
        client = redis.Redis.from_url(redis_url)
        ledger = RunLedger(client, run)
        # Then the wedging prompt alone is dead-lettered, after three trials alone that wedged the server
        (letter,) = ledger.dead_letters()
        assert (letter.prompt_id, letter.reason) == (culprit, "poison_prompt")
        assert letter.error.startswith(
            "no answer alone 3 times, the server answering a canary before and after"
        )
        assert letter.error.count("the server stopped making progress") == DEFAULT_CONVICTIONS_TO_DEAD
        proof = trials(records(client, run)[culprit])
        assert [POLICY.outcome(t) for t in proof] == [Outcome.CONVICTED] * DEFAULT_CONVICTIONS_TO_DEAD
        assert {t.ended for t in proof} == {TrialEnd.WEDGED}
        assert len({t.life for t in proof}) == DEFAULT_CONVICTIONS_TO_DEAD  # each in a server life of its own
        # And the other 47 are committed once, each acquitted by a trial alone after the two wedges
        result = stack.verify(run)
        assert result.returncode == 0, result.stdout + result.stderr
        assert ledger.counts().done == BATCH - 1
        innocents = {p: trials(e) for p, e in records(client, run).items() if p != culprit}
        assert all([POLICY.outcome(t) for t in tried] == [Outcome.ACQUITTED] for tried in innocents.values())
        # And the server was restarted five times: two wedges in company, three alone; each one counted
        assert wedging_gpu.restarts == RESTART_BOUND
        worker_log = stack.generators[0].log_text()
        assert worker_log.count("LIVENESS: restarting the server") == RESTART_BOUND
        first_trial = min(t.started_at for tried in innocents.values() for t in tried)
        last_trial = max(t.started_at for tried in [*innocents.values(), proof] for t in tried)
        print(
            f"isolated in {took_s:.0f} s, {wedging_gpu.restarts} restarts; {len(innocents)} suspects tried "
            f"alone within {last_trial - first_trial:.0f} s"
        )
    finally:
        stack.stop()
