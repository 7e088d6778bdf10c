"""Poison is proven, not guessed, on real processes: a prompt that wedges the whole server is isolated
within a bounded number of server restarts and dead-lettered with its trials, the rest of its batch
committed; an ordinary prompt on a flaky server, however its outages fall, and a prompt SGLang retracts
whenever it has company, are committed once and never dead-lettered.

Real processes throughout: redis-server, simulated GPUs kept up by a supervisor (a restart is a SIGKILL
and a new process on the same port, as `systemctl restart` under `Restart=always`), generate workers and
an uploader, with the README's defaults but where a test says why.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from core.records import SamplingSettings
from inference.simulator import SimulatorProcess, SimulatorSettings, predict_outcome
from inference.simulator.faults import PROMPT_CRASH_LOG_MESSAGE
from tests.simulator.test_simulator_scheduler import sample_value
from tests.support import prompt_files
from tests.support.stack import README_WORKER_ENV, Stack, deployed_server
from tests.support.supervised_simulator import SupervisedSimulator
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.poison import (
    DEFAULT_CONVICTIONS_TO_DEAD,
    DEFAULT_SUSPICIONS_BEFORE_TRIAL,
    Evidence,
    Outcome,
    PoisonPolicy,
    Suspicion,
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
START_AND_CHECK_S = 60.0  # beside a run's wait: the stack's start, verify and stop (pytest's timeout)


def records(client: redis.Redis, run: str) -> dict[str, list[Evidence]]:
    raw = client.hgetall(RunKeys(run).strikes)
    return {key.decode(): decode_evidence(value, key.decode()) for key, value in raw.items()}


def trials(evidence: list[Evidence]) -> list[TrialEnded]:
    return [e for e in evidence if isinstance(e, TrialEnded)]


@pytest.fixture
def wedging_gpu(tmp_path: Path) -> Iterator[SupervisedSimulator]:
    settings = deployed_server(
        speedup=WEDGE_SPEEDUP, enable_metrics=True, prompt_faults=json.dumps({WEDGES: "wedge"})
    )
    server = SupervisedSimulator(lambda _life: settings, tmp_path / "gpu0.pid").start()
    yield server
    server.stop()


@pytest.mark.timeout(WEDGE_FINISH_S + START_AND_CHECK_S)
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


UNLUCKY = "UNLUCKY"  # marks the ordinary prompt the flaky server's outages fall on
FLAKY_SPEEDUP = 10.0  # a completion takes ~3.5 s in company, ~1.4 s alone
CRASH_EVERY_S = 12.0  # each life of the server: it fails every 12 s, whatever it serves
OUTAGE_INTO_IT_S = 1.0  # each outage on it comes 1 s into its request: mid-run, as unrelated outages do
UNLUCKY_MIN_TOKENS = 3000  # its answer: 1.8 s alone at this speedup, so that each outage lands in it
OUTAGES_ON_IT = 7  # two while it runs in company and five alone: today's rule dead-letters it by the fifth
FLAKY_PROMPTS = 30
# The servers' outages make ~17 of the 30 prompts suspects, each tried alone in turn, and each batch an
# outage hands back waits DRAFTGEN_SERVER_DOWN_RETRY_S before it is taken again: 30 s by default, which
# spaced the trials ~35 s apart (410-430 s a run). 1 s leaves what is tested as it was: a trial's verdict
# reads the server's record (its lives of 12 s against the 20 s a failure 1 s in needs), not when the
# batch came back. The run then takes 207-214 s on an idle machine, and went past 420 s once beside the rest
# of the suite on four processes (how many prompts the outages make suspects varies run to run): the wait
# below leaves room for four times the idle run.
FLAKY_HAND_BACK = {"DRAFTGEN_SERVER_DOWN_RETRY_S": "1"}
FLAKY_FINISH_S = 900.0


def long_answering(settings: SimulatorSettings, text: str) -> str:
    """`text` with a salt that makes the simulator answer it with at least UNLUCKY_MIN_TOKENS tokens."""
    for salt in range(1000):
        candidate = f"{text} {UNLUCKY}-{salt}"
        outcome = predict_outcome(
            settings, [{"role": "user", "content": candidate}], SamplingSettings().max_tokens
        )
        if outcome.completion_tokens >= UNLUCKY_MIN_TOKENS:
            return candidate
    raise AssertionError("no salt gives a long enough answer")


@pytest.mark.timeout(FLAKY_FINISH_S + START_AND_CHECK_S)
def test_an_ordinary_prompt_on_a_flaky_server_is_committed_once_however_its_outages_fall(
    redis_url: str, log_dir: Path, tmp_path: Path
) -> None:
    """The issue's case at its worst: two GPUs whose servers die every 12 s whatever they serve, and seven
    of those outages falling on one ordinary prompt's requests, 1 s into each, twice in company and five
    times alone. Its trials alone are void: its servers fail as fast without it (every 12 s on average,
    not the 20 s a failure 1 s in needs), so those outages convict nothing, and once its luck turns it
    completes alone and is committed. (A trial that a server's own 12 s life ends a moment into may convict
    once: the rule's residual, bounded by the three convictions a dead letter needs.) Everything else is
    committed once too."""
    gpus: list[SupervisedSimulator] = []
    flaky = deployed_server(speedup=FLAKY_SPEEDUP, enable_metrics=True, crash_every_s=CRASH_EVERY_S)
    outage = json.dumps({UNLUCKY: {"fault": "crash", "times": 1, "after_s": OUTAGE_INTO_IT_S}})

    def outages_on_it() -> int:
        return sum(gpu.log_text().count(PROMPT_CRASH_LOG_MESSAGE) for gpu in gpus)

    def settings_for_life(_life: int) -> SimulatorSettings:
        unlucky = outages_on_it() < OUTAGES_ON_IT
        return dataclasses.replace(flaky, prompt_faults=outage if unlucky else None)

    gpus.extend(SupervisedSimulator(settings_for_life, tmp_path / f"gpu{i}.pid").start() for i in range(2))
    env = {**README_WORKER_ENV, **FLAKY_HAND_BACK}
    stack = Stack(redis_url, log_dir, gpus, extra_env=env).start()  # type: ignore[arg-type]
    try:
        rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(FLAKY_PROMPTS, "flaky")]
        rows[7]["prompt"] = long_answering(flaky, str(rows[7]["prompt"]))
        unlucky = str(rows[7]["id"])
        run = "flaky"
        data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
        stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--batch-size", "10")
        # When the run goes on by itself
        stack.wait_finished(run, timeout_s=FLAKY_FINISH_S)
        # Then nothing is dead-lettered, and every prompt is committed once
        client = redis.Redis.from_url(redis_url)
        ledger = RunLedger(client, run)
        assert ledger.dead_letters() == []
        result = stack.verify(run)
        assert result.returncode == 0, result.stdout + result.stderr
        assert ledger.counts().done == FLAKY_PROMPTS
        # And the unlucky prompt was tried alone through five outages, each void, then acquitted
        assert outages_on_it() >= OUTAGES_ON_IT
        tried = trials(records(client, run)[unlucky])
        outcomes = [POLICY.outcome(t) for t in tried]
        assert outcomes.count(Outcome.VOID) >= OUTAGES_ON_IT - DEFAULT_SUSPICIONS_BEFORE_TRIAL, tried
        # a trial that its server's own 12 s life ends a moment into may convict (the rule's residual: a
        # failure faster than a twentieth of the server's life); a dead letter needs three, never seen
        assert outcomes.count(Outcome.CONVICTED) < POLICY.convictions_to_dead, tried
        assert outcomes[-1] is Outcome.ACQUITTED, tried
        assert all(
            POLICY.why(t).endswith("of both")
            for t in tried
            if t.ended is TrialEnd.WENT_DOWN and POLICY.outcome(t) is Outcome.VOID
        )
        print(f"{sum(gpu.restarts for gpu in gpus)} restarts; the unlucky prompt's trials: {outcomes}")
    finally:
        stack.stop()
        for gpu in gpus:
            gpu.stop()


RETRACTED = "LONG-INPUT"
RETRACT_SPEEDUP = 2.0
# A retracted request is cut after the silence limit while others stream: 2 s instead of the default 30 s
# so that the test takes a minute (at this speedup every other request streams a chunk every ~40 ms).
RETRACT_SILENCE_LIMIT_S = 2.0
RETRACT_PAUSE_S = 3 * RETRACT_SILENCE_LIMIT_S
# A suspect waits for its server's control (20x a liveness poll): a 0.25 s poll makes that wait 5 s, not 100.
RETRACT_LIVENESS = {
    "DRAFTGEN_LIVENESS_POLL_S": "0.25",
    "DRAFTGEN_SILENCE_LIMIT_S": str(RETRACT_SILENCE_LIMIT_S),
}
RETRACT_PROMPTS = 24
COMPANY_CLIENTS = 4
COMPANY_MAX_TOKENS = 300
# Each client's requests a little longer than the last one's: their ends drift apart, so the server never
# waits between the company's requests all at once (with equal lengths they ended and prefilled together)
COMPANY_STAGGER_TOKENS = 70
COMPANY_TIMEOUT_S = 60.0


class Company:
    """Another client keeping a server under load, as a fleet's other work would, `clients` requests at a
    time, until stopped."""

    def __init__(self, base_url: str, clients: int) -> None:
        self._base_url = base_url
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._keep_busy, args=(COMPANY_MAX_TOKENS + i * COMPANY_STAGGER_TOKENS,), daemon=True
            )
            for i in range(clients)
        ]

    def __enter__(self) -> Company:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(COMPANY_TIMEOUT_S)

    def _keep_busy(self, max_tokens: int) -> None:
        body = {"messages": [{"role": "user", "content": "company"}], "max_tokens": max_tokens}
        with httpx.Client(timeout=COMPANY_TIMEOUT_S) as client:
            while not self._stop.is_set():
                client.post(f"{self._base_url}/chat/completions", json=body)


@pytest.fixture
def retracting_gpu() -> Iterator[SimulatorProcess]:
    faults = json.dumps({RETRACTED: {"fault": "retract", "pause_s": RETRACT_PAUSE_S}})
    settings = deployed_server(speedup=RETRACT_SPEEDUP, enable_metrics=True, prompt_faults=faults)
    with SimulatorProcess(settings) as sim:
        yield sim


@pytest.mark.timeout(FLAKY_FINISH_S + START_AND_CHECK_S)
def test_a_prompt_retracted_whenever_it_has_company_is_committed_once_never_dead_lettered(
    redis_url: str, log_dir: Path, retracting_gpu: SimulatorProcess, tmp_path: Path
) -> None:
    """SGLang retracts requests under KV pressure (long inputs, few output tokens first): silent while the
    others generate, then resumed. Each time in company it is cut for silence: a suspicion, no evidence.
    Tried alone (nothing else of its worker in flight, though the server stays loaded and retracts it
    again), its silence is judged with the liveness stall window: it resumes, completes, and is committed
    once. Today's rule dead-letters it after five cuts."""
    env = {**README_WORKER_ENV, **RETRACT_LIVENESS}
    stack = Stack(redis_url, log_dir, [retracting_gpu], extra_env=env).start()
    try:
        with Company(retracting_gpu.base_url, COMPANY_CLIENTS):
            rows = [prompt_files.as_prompt(row) for row in prompt_files.questions(RETRACT_PROMPTS, "retract")]
            rows[3]["prompt"] = f"{rows[3]['prompt']} {RETRACTED}"
            retracted = str(rows[3]["id"])
            run = "retracted"
            data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
            stack.enqueue(data, run, "--output", str(tmp_path / "out"))
            stack.wait_finished(run, timeout_s=FLAKY_FINISH_S)
        client = redis.Redis.from_url(redis_url)
        ledger = RunLedger(client, run)
        assert ledger.dead_letters() == []
        assert ledger.counts().done == RETRACT_PROMPTS
        result = stack.verify(run)
        assert result.returncode == 0, result.stdout + result.stderr
        evidence = records(client, run)[retracted]
        suspicions = [(e.cause, e.with_server) for e in evidence if isinstance(e, Suspicion)]
        assert suspicions == [("silent", False)] * DEFAULT_SUSPICIONS_BEFORE_TRIAL
        assert [POLICY.outcome(t) for t in trials(evidence)] == [Outcome.ACQUITTED]
        # and the server did retract it each time it ran in company
        metrics = httpx.get(f"{retracting_gpu.url}/metrics", timeout=COMPANY_TIMEOUT_S).text
        assert (
            sample_value(metrics, "sglang:num_retracted_requests_total")
            == DEFAULT_SUSPICIONS_BEFORE_TRIAL + 1
        )
    finally:
        stack.stop()
