"""Status, pause/resume, the quality gate, the truncation retry policy and the metrics endpoint, on real
runs against simulated GPUs whose lengths are known.

One module-scoped stack (Redis DB 4): two simulators at speedup 15, where the servers, not the two
CPUs of a test machine, bound the throughput (at speedup 40 the pipeline reached only half the
servers' capacity and its rate wandered with the machine's load, which no ETA can foresee).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from core.exit_codes import EXIT_OK, EXIT_PAUSED_BY_GATE
from devstack.local_stack import PROJECT_ROOT, ManagedProcess, free_port, http_ok, wait_until
from inference.simulator import RequestRecord, SimulatorSettings, predict_outcome
from producer.cli import main as producer_main
from producer.settings import REDIS_URL_ENV
from producer.status.gather import gather_status
from producer.status.model import RunStatus
from tests.support import prompt_files
from tests.support.stack import Stack, deployed_server, simulators
from workers.record.manifest import completion_keys, read_manifest
from workers.record.storage import open_store
from workers.settings import DEFAULT_MAX_IN_FLIGHT
from workers.state.control import PAUSED_BY_GATE, PAUSED_BY_USER
from workers.state.keys import RunKeys
from workers.state.runs import decode_run_settings
from workers.state.stats_fields import RATE_WINDOW_S

pytestmark = pytest.mark.integration

SPEEDUP = 15.0
WAIT_TIMEOUT_S = 10.0  # `wait` on a run already ended answers at its first look
WAIT_INTERVAL_S = 0.5
GPUS = 2
STEADY_PROMPTS = 450  # about 17 s of generation on two simulated GPUs at this speedup
STEADY_BATCH_SIZE = 16
# Batches each worker holds, pinned here: enough to keep 48 slots full with batches of 16, few enough
# that the queue still holds waiting batches at 40% and the last batches spread over both GPUs.
BATCHES_IN_FLIGHT = 4
STACK_ENV = {"DRAFTGEN_BATCHES_IN_FLIGHT": str(BATCHES_IN_FLIGHT)}
ETA_MEASURED_AT = 0.40  # share of the prompts generated when the ETA is read
# The ETA extrapolates the last minute's completion rate, so it runs short by the final drain: once the
# queue is empty the last requests finish while slots empty, about half a request latency (48 model s /
# speedup 15 / 2 ≈ 1.6 s) against ~10 s left at 40%: about 80/N = 18% for N = 450 prompts (measured
# -9% to -18% over three runs). The rate's sampling noise adds ~4% at one sigma (~180 completions in the
# window, lengths with a CV of 0.55). 30% = the drain plus two sigmas and a little room for load from
# other processes; a wrong rate (a whole-run average, a window that misses the run's start, tokens taken
# for completions) misses by far more.
# This run is younger than status's minute, so its rate is counted from its first staged completion, and
# the first completions of a run are staged up to FIRST_STAGE_LAG_S after they finish (measured 2.6-2.8 s
# on 2 cores, the same at 9ce7772): their burst inflates the young window's rate and shortens the ETA by
# up to half here. A real run's ETA at 40% is read over a whole minute of steady completions.
ETA_TOLERANCE = 0.50
PRICE_PER_GPU_HOUR = 3.80
PAUSE_BATCH_SIZE = 8
PAUSE_PROMPTS = 400  # well beyond what a pause lets finish: GPUS x (held batches + a tail window)
PAUSE_AFTER_COMPLETIONS = 30
QUIET_FOR_S = 2.0  # how long the servers must stay idle and the count still, to call generation stopped
RESUME_TIMEOUT_S = 70.0  # paused batches come back within the workers' 30 s retry, then ~5 s of work
GATE_MIN_COMPLETIONS = 50
GATE_PROMPTS = 150
GATE_MAX_TOKENS = 256  # far below the ~2,300-token thinking traces: nearly every output is truncated
RETRY_PROMPTS = 40
RETRY_FIRST_BUDGET = 512
RETRY_CAP = 2048
ACCEPT_LENGTH = SimulatorSettings().accept_length
ACCEPT_LENGTH_DRAW_SLACK = 0.2  # the simulator draws each step's accepted tokens around the mean
# Status times a completion when it is staged, which on a loaded machine can trail its finish by up to a
# second; the run's first staging starts status's clock, so the records' span may be that much longer.
STAGE_LAG_SLACK_S = 1.0
FIRST_STAGE_LAG_S = 3.0


@pytest.fixture(scope="module")
def stack(redis_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    redis_url = redis_server.rsplit("/", 1)[0] + "/4"
    redis.Redis.from_url(redis_url).flushdb()
    sims = simulators(GPUS, speedup=SPEEDUP, request_log_size=20_000)
    running = Stack(redis_url, tmp_path_factory.mktemp("logs"), sims, extra_env=STACK_ENV).start()
    yield running
    running.stop()
    for sim in sims:
        sim.stop()


def client_of(stack: Stack) -> redis.Redis:
    return redis.Redis.from_url(stack.redis_url)


def status_of(stack: Stack, run: str) -> RunStatus:
    return gather_status(client_of(stack), run, price_per_gpu_hour=PRICE_PER_GPU_HOUR)


def output(stack: Stack, run: str) -> str:
    return decode_run_settings(client_of(stack).get(RunKeys(run).settings)).output


def committed_rows(stack: Stack, run: str) -> list[dict[str, object]]:
    store = open_store(output(stack, run))
    rows: list[dict[str, object]] = []
    for key in completion_keys(read_manifest(store)):
        rows.extend(pq.read_table(io.BytesIO(store.get(key))).to_pylist())
    return rows


def server_requests(stack: Stack, run: str) -> list[RequestRecord]:
    return [r for sim in stack.sims for r in sim.admin.requests() if r.rid.startswith(run + ":")]


@contextlib.contextmanager
def redis_url_in_env(url: str) -> Iterator[None]:
    """DRAFTGEN_REDIS_URL for the commands run in this process (a password never goes on a command line)."""
    before = os.environ.get(REDIS_URL_ENV)
    os.environ[REDIS_URL_ENV] = url
    try:
        yield
    finally:
        if before is None:
            del os.environ[REDIS_URL_ENV]
        else:
            os.environ[REDIS_URL_ENV] = before


def producer(stack: Stack, *args: str) -> tuple[int, str]:
    """`python -m producer ARGS` in this process (status, pause, resume, verify need no Celery app)."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output), redis_url_in_env(stack.redis_url):
        code = producer_main(list(args))
    return code, output.getvalue()


def servers_idle(stack: Stack) -> bool:
    for sim in stack.sims:
        info = sim.admin.server_info()["simulator"]
        if info["num_running_reqs"] or info["num_queue_reqs"]:
            return False
    return True


def holds_for(condition: Callable[[], bool], seconds: float, *, timeout_s: float, what: str) -> None:
    """Wait until `condition` has held continuously for `seconds` (deadline `timeout_s`)."""
    since: list[float] = []

    def held() -> bool:
        if not condition():
            since.clear()
            return False
        since[:1] = since[:1] or [time.monotonic()]
        return time.monotonic() - since[0] >= seconds

    wait_until(held, timeout_s=timeout_s, what=what)


def prompts_file(tmp_path: Path, count: int, prefix: str) -> Path:
    return prompt_files.write_jsonl(
        tmp_path / f"{prefix}.jsonl",
        [prompt_files.as_prompt(r) for r in prompt_files.questions(count, prefix)],
    )


def generated(status: RunStatus) -> float:
    progress = status.progress
    return (progress.committed + progress.staged + progress.dead_lettered) / progress.enqueued


@dataclass
class SteadyRun:
    run: str
    at_40_percent: RunStatus
    final: RunStatus
    rows: list[dict[str, object]]


@pytest.fixture(scope="module")
def steady_run(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> SteadyRun:
    """A healthy run of known prompts, watched by status while it runs."""
    run = "status-steady"
    folder = tmp_path_factory.mktemp("steady")
    stack.enqueue(
        prompts_file(folder, STEADY_PROMPTS, run),
        run,
        "--output",
        str(folder / "out"),
        "--batch-size",
        str(STEADY_BATCH_SIZE),
    )
    snapshots: list[RunStatus] = []

    def forty_percent_generated() -> bool:
        snapshots.append(status_of(stack, run))
        return generated(snapshots[-1]) >= ETA_MEASURED_AT

    wait_until(forty_percent_generated, timeout_s=60, what=f"{run} to be {ETA_MEASURED_AT:.0%} generated")
    stack.wait_finished(run)
    wait_until(
        lambda: all(q.waiting == 0 and q.in_flight == 0 for q in status_of(stack, run).queues),
        timeout_s=30,
        what="the queues to drain",
    )
    return SteadyRun(run, snapshots[-1], status_of(stack, run), committed_rows(stack, run))


def test_eta_at_forty_percent_is_within_the_tolerance_of_the_real_remaining_time(
    steady_run: SteadyRun,
) -> None:
    snapshot = steady_run.at_40_percent
    assert snapshot.eta.seconds is not None, snapshot.eta.basis
    finished_at = steady_run.final.throughput.last_completion_at
    assert finished_at is not None
    actual = finished_at - snapshot.now
    assert abs(snapshot.eta.seconds - actual) <= ETA_TOLERANCE * actual, (snapshot.eta, actual)


def test_while_running_status_counts_waiting_and_in_flight_batches_per_queue(
    steady_run: SteadyRun,
) -> None:
    generate = next(q for q in steady_run.at_40_percent.queues if q.queue == "generate")
    assert generate.waiting > 0
    # Each generate worker holds its thread pool's worth of batches: acked late, prefetch 1.
    assert 1 <= generate.in_flight <= GPUS * BATCHES_IN_FLIGHT


def test_the_recent_rates_match_the_completions_the_records_show_in_that_window(
    steady_run: SteadyRun,
) -> None:
    snapshot = steady_run.at_40_percent
    recent = snapshot.throughput.last_minute
    # Status counts a completion when it is staged, up to STAGE_LAG_SLACK_S after it finished. So its
    # window holds every record finished that long before its end, and none finished before its start
    # by more than that. A run younger than the window is measured from its first staged completion.
    end = snapshot.now
    start = float("-inf") if recent.window_s < RATE_WINDOW_S else end - recent.window_s

    def finished(since: float, until: float) -> list[dict[str, object]]:
        return [row for row in steady_run.rows if since <= row["timings"]["finished_at"] <= until]  # type: ignore[index]

    def tokens(rows: list[dict[str, object]]) -> int:
        return sum(row["usage"]["completion_tokens"] for row in rows)  # type: ignore[index]

    surely_in = finished(start, end - STAGE_LAG_SLACK_S)
    maybe_in = finished(start - STAGE_LAG_SLACK_S, end)
    assert len(surely_in) <= recent.completions <= len(maybe_in)
    assert tokens(surely_in) <= recent.output_tokens <= tokens(maybe_in)
    # The per-GPU rows split the same tokens.
    assert sum(row.output_tokens_per_s for row in snapshot.gpus) == pytest.approx(recent.output_tokens_per_s)


def test_each_status_figure_of_a_finished_run_matches_what_the_run_produced(
    stack: Stack, steady_run: SteadyRun
) -> None:
    status, rows = steady_run.final, steady_run.rows
    # Progress: every prompt committed once, nothing staged, dead or rejected.
    assert status.state == "finished"
    assert (status.progress.enqueued, status.progress.committed) == (STEADY_PROMPTS, STEADY_PROMPTS)
    assert len(rows) == STEADY_PROMPTS
    assert (status.progress.staged, status.progress.dead_lettered, status.progress.remaining) == (0, 0, 0)
    assert status.progress.rejected_rows == 0 and status.dead_letters == {}
    assert (status.eta.seconds, status.paused) == (0.0, None)
    assert status.warnings == []
    # Tokens: the committed records and the servers' own request log agree with status.
    tokens = sum(row["usage"]["completion_tokens"] for row in rows)  # type: ignore[index]
    served = server_requests(stack, steady_run.run)
    assert sum(r.completion_tokens for r in served if r.status == "ok") == tokens
    whole = status.throughput.whole_run
    assert (whole.completions, whole.output_tokens) == (STEADY_PROMPTS, tokens)
    assert status.throughput.mean_output_tokens == pytest.approx(tokens / STEADY_PROMPTS)
    # Whole-run rates: the records' finish times span the same time.
    finishes = [row["timings"]["finished_at"] for row in rows]  # type: ignore[index]
    span = max(finishes) - min(finishes)
    assert span - FIRST_STAGE_LAG_S <= whole.window_s <= span + STAGE_LAG_SLACK_S
    assert whole.completions_per_s == pytest.approx(STEADY_PROMPTS / whole.window_s)
    assert whole.output_tokens_per_s == pytest.approx(tokens / whole.window_s)
    # Quality and finish reasons: exactly the records' labels.
    labels = Counter(str(row["quality"]) for row in rows)
    assert all(status.quality.counts[label] == labels.get(label, 0) for label in status.quality.counts)
    assert status.quality.finish_reasons == dict(Counter(str(row["finish_reason"]) for row in rows))
    # Upload: the manifest's objects, nothing left behind.
    entries = read_manifest(open_store(output(stack, steady_run.run)))
    assert status.upload.objects_committed == len(entries)
    assert status.upload.committed_bytes == sum(entry.bytes for entry in entries)
    assert (status.upload.staged, status.upload.staged_bytes) == (0, 0)
    # GPUs: one row per simulated GPU, from the records' origins, each with a live heartbeat.
    origins = {f"{row['origin']['host']}/gpu{row['origin']['gpu']}" for row in rows}  # type: ignore[index]
    assert {row.worker for row in status.gpus} == origins and len(origins) == GPUS
    for gpu in status.gpus:
        assert gpu.server_health == 200 and gpu.suspended is False
        assert gpu.spec_accept_length == pytest.approx(ACCEPT_LENGTH, abs=ACCEPT_LENGTH_DRAW_SLACK)
    # Cost: two GPUs for the time since the first completion, at the price given.
    assert status.cost.gpus == GPUS
    assert status.cost.elapsed_s == pytest.approx(whole.window_s)
    assert status.cost.so_far_usd == pytest.approx(GPUS * status.cost.elapsed_s / 3600 * PRICE_PER_GPU_HOUR)


def test_the_gate_leaves_a_healthy_run_alone(steady_run: SteadyRun) -> None:
    gate = steady_run.final.gate
    assert gate.judged_since_resume == STEADY_PROMPTS >= gate.min_completions
    assert gate.failing is None and steady_run.final.paused is None


def test_the_text_and_json_views_show_the_same_run(stack: Stack, steady_run: SteadyRun) -> None:
    code, text = producer(stack, "status", "--run", steady_run.run, "--price-per-gpu-hour", "3.8")
    assert code == 0
    assert f"{STEADY_PROMPTS:,} / {STEADY_PROMPTS:,} committed" in text
    assert "finished" in text and "ETA" in text and "$3.80 per GPU-hour" in text
    code, as_json = producer(stack, "status", "--run", steady_run.run, "--json")
    figures = json.loads(as_json)
    assert figures["progress"]["committed"] == STEADY_PROMPTS
    whole = figures["throughput"]["whole_run"]
    assert whole["output_tokens"] == steady_run.final.throughput.whole_run.output_tokens


def test_the_metrics_endpoint_serves_the_run_queue_and_gpu_figures(
    stack: Stack, steady_run: SteadyRun
) -> None:
    port = free_port()
    exporter = ManagedProcess(
        "metrics",
        [sys.executable, "-m", "producer", "metrics", "--port", str(port), "--runs", steady_run.run],
        stack.log_dir / "metrics.log",
        env=stack.env(),
    ).start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        exporter.wait_ready(lambda: http_ok(url), timeout_s=20)
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        exporter.stop()
    families = list(text_string_to_metric_families(text))
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }
    # Every metric the Grafana dashboard queries is one the exporter serves.
    dashboard = (PROJECT_ROOT / "deploy" / "grafana-dashboard.json").read_text()
    queried = {name.removesuffix("_total") for name in re.findall(r"draftgen_[a-z_]+", dashboard)}
    assert queried <= {family.name for family in families}
    run = (("run", steady_run.run),)
    status = steady_run.final
    assert samples[("draftgen_redis_up", ())] == 1
    assert samples[("draftgen_prompts_committed_total", run)] == STEADY_PROMPTS
    assert samples[("draftgen_prompts_enqueued_total", run)] == STEADY_PROMPTS
    assert samples[("draftgen_output_tokens_total", run)] == status.throughput.whole_run.output_tokens
    assert samples[("draftgen_run_paused", run)] == 0
    ok_records = sum(1 for row in steady_run.rows if row["quality"] == "ok")
    assert samples[("draftgen_completions_by_quality_total", (("quality", "ok"), *run))] == ok_records
    for queue in ("generate", "upload"):
        assert ("draftgen_queue_waiting_messages", (("queue", queue),)) in samples
        assert ("draftgen_queue_in_flight_messages", (("queue", queue),)) in samples
    for gpu in status.gpus:
        assert samples[("draftgen_gpu_server_healthy", (("gpu", gpu.worker),))] == 1
        accept = samples[("draftgen_gpu_spec_accept_length_tokens", (("gpu", gpu.worker),))]
        assert accept == pytest.approx(ACCEPT_LENGTH, abs=ACCEPT_LENGTH_DRAW_SLACK)


@dataclass
class PausedRun:
    run: str
    completions_at_pause: int
    settled: RunStatus  # once the batches held at the pause finished
    resume_output: str


@pytest.fixture(scope="module")
def paused_then_resumed_run(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> PausedRun:
    """A run paused by hand mid-run, watched until generation stopped, then resumed.

    Resumed batches come back only after the workers' 30 s paused-retry delay, so the tests that
    need the run finished come last in this module and the other runs go on meanwhile."""
    run = "status-pause"
    folder = tmp_path_factory.mktemp("pause")
    stack.enqueue(
        prompts_file(folder, PAUSE_PROMPTS, run),
        run,
        "--output",
        str(folder / "out"),
        "--batch-size",
        str(PAUSE_BATCH_SIZE),
    )
    wait_until(
        lambda: status_of(stack, run).throughput.whole_run.completions >= PAUSE_AFTER_COMPLETIONS,
        timeout_s=30,
        what=f"{PAUSE_AFTER_COMPLETIONS} completions",
    )
    code, _ = producer(stack, "pause", "--run", run, "--reason", "checking the data")
    assert code == 0
    at_pause = status_of(stack, run).throughput.whole_run.completions
    holds_for(lambda: servers_idle(stack), QUIET_FOR_S, timeout_s=30, what="the servers to go idle")
    settled = status_of(stack, run)
    holds_for(
        lambda: (
            status_of(stack, run).throughput.whole_run.completions == settled.throughput.whole_run.completions
        ),
        QUIET_FOR_S,
        timeout_s=10,
        what="no new completion while paused",
    )
    code, resumed = producer(stack, "resume", "--run", run)
    assert code == 0
    return PausedRun(run, at_pause, settled, resumed)


def test_a_paused_run_finishes_only_the_batches_already_held_and_status_says_so(
    paused_then_resumed_run: PausedRun,
) -> None:
    settled = paused_then_resumed_run.settled
    # the batches held, plus the tails of batches already sent: at most a window of requests per GPU
    held_at_most = GPUS * (BATCHES_IN_FLIGHT * PAUSE_BATCH_SIZE + DEFAULT_MAX_IN_FLIGHT)
    assert (
        settled.throughput.whole_run.completions - paused_then_resumed_run.completions_at_pause
        <= held_at_most
    )
    assert settled.progress.remaining > 0
    assert settled.state == "paused" and settled.paused is not None
    assert (settled.paused.by, settled.paused.reason) == (PAUSED_BY_USER, "checking the data")
    assert settled.eta.seconds is None
    assert "was paused by user" in paused_then_resumed_run.resume_output


def test_the_gate_pauses_a_run_that_truncates_most_outputs_and_status_says_why(
    stack: Stack, tmp_path: Path
) -> None:
    run = "status-gate"
    stack.enqueue(
        prompts_file(tmp_path, GATE_PROMPTS, run),
        run,
        "--output",
        str(tmp_path / "out"),
        "--max-tokens",
        str(GATE_MAX_TOKENS),
        "--gate-min-completions",
        str(GATE_MIN_COMPLETIONS),
    )
    wait_until(
        lambda: status_of(stack, run).paused is not None, timeout_s=30, what="the gate to pause the run"
    )
    status = status_of(stack, run)
    assert status.paused is not None and status.paused.by == PAUSED_BY_GATE
    assert "hit max_tokens" in status.paused.reason and "limit" in status.paused.reason
    judged = status.paused.reason.split(" of the last ")[1].split()[0]
    assert int(judged) >= GATE_MIN_COMPLETIONS
    assert status.gate.truncated_rate > status.gate.max_truncated_rate
    assert status.quality.rates["truncated_in_thinking"] > status.gate.max_truncated_rate
    _, text = producer(stack, "status", "--run", run)
    assert "PAUSED by quality-gate" in text and "hit max_tokens" in text
    code, waited = producer(stack, "wait", "--run", run, "--timeout", str(WAIT_TIMEOUT_S))
    assert code == EXIT_PAUSED_BY_GATE, waited
    assert f"run {run} paused:" in waited  # its status line; the verdict goes to stderr


def test_the_retry_policy_gives_prompts_truncated_in_thinking_a_doubled_budget(
    stack: Stack, tmp_path: Path
) -> None:
    run = "status-retry"
    rows = prompt_files.questions(RETRY_PROMPTS, run)
    sim_settings = deployed_server()

    def budgets(question: object) -> list[int]:
        """The budgets the policy should ask with: double while thinking is cut off, up to the cap."""
        messages = [{"role": "user", "content": str(question)}]
        asked = [RETRY_FIRST_BUDGET]
        while asked[-1] < RETRY_CAP:
            outcome = predict_outcome(sim_settings, messages, asked[-1])
            if not (outcome.finish_reason == "length" and outcome.content_empty):
                break
            asked.append(min(asked[-1] * 2, RETRY_CAP))
        return asked

    expected = {str(row["id"]): budgets(row["question"]) for row in rows}
    assert any(len(asked) > 1 for asked in expected.values())
    stack.enqueue(
        prompt_files.write_jsonl(tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in rows]),
        run,
        "--output",
        str(tmp_path / "out"),
        "--max-tokens",
        str(RETRY_FIRST_BUDGET),
        "--truncated-thinking",
        "retry",
        "--retry-max-tokens-cap",
        str(RETRY_CAP),
    )
    stack.wait_finished(run)
    asked: dict[str, list[int | None]] = {}
    for request in sorted(server_requests(stack, run), key=lambda r: r.received_at):
        asked.setdefault(request.rid.split(":")[1], []).append(request.max_completion_tokens)
    assert asked == expected
    for row in committed_rows(stack, run):
        budgets_asked = expected[str(row["prompt_id"])]
        assert row["budget_retries"] == len(budgets_asked) - 1
        assert row["sampling"]["max_tokens"] == budgets_asked[-1]  # type: ignore[index]


def test_a_resumed_run_completes_with_every_prompt_generated_once_and_verify_passes(
    stack: Stack, paused_then_resumed_run: PausedRun
) -> None:
    run = paused_then_resumed_run.run
    code, waited = producer(
        stack, "wait", "--run", run, "--timeout", str(RESUME_TIMEOUT_S), "--interval", "0.5"
    )
    assert code == EXIT_OK, waited
    assert waited.endswith(f"run {run} finished: all {PAUSE_PROMPTS} prompts committed\n")
    _, listed = producer(stack, "runs")
    line = next(line for line in listed.splitlines() if line.startswith(f"{run} "))
    assert line.split()[1:4] == ["finished", f"{PAUSE_PROMPTS}/{PAUSE_PROMPTS}", "100.0%"], listed
    code, verified = producer(stack, "verify", "--run", run)
    assert code == 0, verified
    answered = Counter(r.rid.split(":")[1] for r in server_requests(stack, run) if r.status == "ok")
    assert len(answered) == PAUSE_PROMPTS and set(answered.values()) == {1}
    assert status_of(stack, run).state == "finished"
