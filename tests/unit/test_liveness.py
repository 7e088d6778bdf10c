"""Liveness by token progress: parsing /metrics, the judge's transitions on a fake clock, and what the
watcher does on a hang, with a fake server, engine and queue (no thread, no sleep)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from inference.errors import InferenceRejected, InferenceUnavailable, ServerNotReady
from inference.metrics_reader import MetricsSnapshot, parse_metrics
from inference.readiness import ReadinessTarget
from workers.generate.liveness import (
    Liveness,
    LivenessJudge,
    LivenessVerdict,
    LivenessWatcher,
    Outage,
    run_restart_command,
)
from workers.settings import WorkerSettings

STALL_S = 300.0
COMPLETION_STALL_S = 1500.0
SERVER_URL = "http://127.0.0.1:30000"
RESTART_COMMAND = "systemctl restart draftgen-sglang@0"

SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen3.6-27B",pp_rank="0",tp_rank="0"} 48.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen3.6-27B",pp_rank="0",tp_rank="0"} 5.0
# HELP sglang:realtime_tokens_total Tokens processed by forward passes.
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{engine_type="unified",mode="decode",model_name="Qwen3.6-27B"} 120000.0
sglang:realtime_tokens_total{engine_type="unified",mode="prefill_compute",model_name="Qwen3.6-27B"} 9000.0
sglang:realtime_tokens_total{engine_type="unified",mode="prefill_cache",model_name="Qwen3.6-27B"} 1000.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="Qwen3.6-27B"} 70000.0
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="Qwen3.6-27B"} 5000.0
# HELP sglang:num_requests_total The number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{engine_type="unified",is_streaming="false",model_name="Qwen3.6-27B"} 30.0
# HELP sglang:spec_verify_calls_total Speculative verify passes.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{engine_type="unified",model_name="Qwen3.6-27B"} 20000.0
"""

COMPLETION_COUNTERS_ONLY = """\
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 9645.0
# TYPE sglang:generation_tokens_created gauge
sglang:generation_tokens_created{engine_type="unified",is_streaming="false",model_name="m"} 1.7e9
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{engine_type="unified",is_streaming="false",model_name="m"} 5.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
"""

PRIORITY_METRICS = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",priority=""} 10.0
sglang:num_running_reqs{model_name="m",priority="1"} 4.0
sglang:num_running_reqs{model_name="m",priority="2"} 6.0
# TYPE sglang:realtime_tokens_total counter
sglang:realtime_tokens_total{mode="decode",model_name="m",priority=""} 50.0
sglang:realtime_tokens_total{mode="decode",model_name="m",priority="1"} 20.0
"""


def snapshot(
    *, running: int = 48, queued: int = 0, decode: float | None = 1000.0, generated: float = 500.0
) -> MetricsSnapshot:
    return MetricsSnapshot(
        running_requests=running,
        queued_requests=queued,
        generation_tokens_total=generated,
        requests_total=10.0,
        decode_tokens_total=decode,
        prefill_tokens_total=None if decode is None else 0.0,
    )


def judge() -> LivenessJudge:
    return LivenessJudge(stall_s=STALL_S, completion_stall_s=COMPLETION_STALL_S)


# ----- reading /metrics -----


def test_sglang_metrics_give_the_load_and_the_per_step_decode_counter() -> None:
    read = parse_metrics(SGLANG_METRICS)
    assert (read.running_requests, read.queued_requests) == (48, 5)
    assert read.decode_tokens_total == 120000.0
    assert read.prefill_tokens_total == 10000.0
    assert read.generation_tokens_total == 75000.0  # streaming and not, summed
    assert read.requests_total == 30.0
    assert read.spec_verify_calls_total == 20000.0
    assert read.has_step_counter and read.busy


def test_a_server_without_the_step_counter_is_read_by_its_completion_counters() -> None:
    """A server that has run no forward pass yet (or predates `realtime_tokens_total`)."""
    read = parse_metrics(COMPLETION_COUNTERS_ONLY)
    assert (read.running_requests, read.generation_tokens_total, read.requests_total) == (3, 9645.0, 5.0)
    assert read.decode_tokens_total is None and read.spec_verify_calls_total is None
    assert not read.has_step_counter


def test_with_priority_scheduling_only_the_totals_are_read() -> None:
    read = parse_metrics(PRIORITY_METRICS)
    assert read.running_requests == 10
    assert read.decode_tokens_total == 50.0


def test_an_empty_exposition_reads_as_an_idle_server() -> None:
    read = parse_metrics("")
    assert not read.busy and read.progress == (0.0, 0.0, 0.0, 0.0, 0.0)


# ----- the judge, on a fake clock -----


def test_a_server_making_progress_is_live() -> None:
    watching = judge()
    for step in range(10):
        verdict = watching.observe(step * 100.0, snapshot(decode=1000.0 + step), waiting=48)
        assert verdict.state is Liveness.LIVE


def test_a_busy_server_without_progress_is_hung_once_the_stall_window_passes() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(), waiting=0)
    assert watching.observe(STALL_S - 1, snapshot(), waiting=0).state is Liveness.LIVE
    verdict = watching.observe(STALL_S, snapshot(), waiting=0)
    assert verdict.state is Liveness.HUNG
    assert "48 running" in verdict.reason and "per-step token counter" in verdict.reason


def test_an_idle_server_is_never_hung_however_long_its_counters_stay_still() -> None:
    watching = judge()
    for hour in range(5):
        idle = snapshot(running=0, queued=0)
        assert watching.observe(hour * 3600.0, idle, waiting=0).state is Liveness.LIVE


def test_idle_time_does_not_count_towards_a_stall() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(running=0), waiting=0)
    watching.observe(3600.0, snapshot(running=0), waiting=0)
    # requests arrive after an hour idle: the window starts now, not an hour ago
    assert watching.observe(3601.0, snapshot(running=48), waiting=48).state is Liveness.LIVE
    assert watching.observe(3600.0 + STALL_S, snapshot(running=48), waiting=48).state is Liveness.HUNG


def test_requests_in_flight_from_this_worker_count_as_busy_when_the_gauges_say_idle() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(running=0), waiting=12)
    verdict = watching.observe(STALL_S, snapshot(running=0), waiting=12)
    assert verdict.state is Liveness.HUNG and "12 waiting on it from this worker" in verdict.reason


def test_queued_requests_alone_count_as_busy() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(running=0, queued=3), waiting=0)
    assert watching.observe(STALL_S, snapshot(running=0, queued=3), waiting=0).state is Liveness.HUNG


def test_with_only_completion_counters_the_longer_window_applies() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(decode=None), waiting=48)
    assert watching.observe(STALL_S, snapshot(decode=None), waiting=48).state is Liveness.LIVE
    verdict = watching.observe(COMPLETION_STALL_S, snapshot(decode=None), waiting=48)
    assert verdict.state is Liveness.HUNG and "completion counters" in verdict.reason


def test_a_server_once_seen_with_the_per_step_counter_keeps_the_short_window_after_a_restart() -> None:
    """Restarted with --skip-server-warmup, a server shows no per-step series until its first forward
    pass; hung before it, it is still judged within the short window."""
    watching = judge()
    watching.observe(0.0, snapshot(), waiting=48)
    watching.reset()  # the watch restarted it
    watching.observe(10.0, snapshot(decode=None), waiting=48)
    verdict = watching.observe(10.0 + STALL_S, snapshot(decode=None), waiting=48)
    assert verdict.state is Liveness.HUNG and "per-step token counter" in verdict.reason


def test_a_hung_server_recovers_when_progress_resumes() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(), waiting=48)
    assert watching.observe(STALL_S, snapshot(), waiting=48).state is Liveness.HUNG
    assert watching.observe(STALL_S + 5, snapshot(decode=1001.0), waiting=48).state is Liveness.LIVE
    # and the next stall is measured from that progress
    assert watching.observe(2 * STALL_S, snapshot(decode=1001.0), waiting=48).state is Liveness.LIVE
    assert watching.observe(2 * STALL_S + 5, snapshot(decode=1001.0), waiting=48).state is Liveness.HUNG


def test_counters_reset_by_a_server_restart_count_as_progress() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(decode=5000.0), waiting=48)
    restarted = snapshot(decode=0.0, generated=0.0)
    assert watching.observe(STALL_S, restarted, waiting=48).state is Liveness.LIVE


def test_metrics_that_do_not_answer_make_the_server_down_after_three_polls() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(), waiting=0)
    assert watching.observe(5.0, None, waiting=0).state is Liveness.LIVE
    assert watching.observe(10.0, None, waiting=0).state is Liveness.LIVE
    verdict = watching.observe(15.0, None, waiting=0)
    assert verdict.state is Liveness.DOWN and "unanswered 3 times" in verdict.reason


def test_a_server_that_never_answered_is_down_too() -> None:
    watching = judge()
    states = [watching.observe(t, None, waiting=0).state for t in (0.0, 5.0, 10.0)]
    assert states == [Liveness.LIVE, Liveness.LIVE, Liveness.DOWN]


def test_one_answer_between_failures_starts_the_down_count_again() -> None:
    watching = judge()
    for now in (0.0, 5.0):
        watching.observe(now, None, waiting=0)
    watching.observe(10.0, snapshot(), waiting=0)
    assert watching.observe(15.0, None, waiting=0).state is Liveness.LIVE
    assert watching.observe(20.0, None, waiting=0).state is Liveness.LIVE


def test_a_stall_still_shows_while_a_scrape_or_two_fail() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(), waiting=48)
    assert watching.observe(STALL_S, None, waiting=48).state is Liveness.HUNG


def test_after_a_reset_the_next_snapshot_is_a_fresh_baseline() -> None:
    watching = judge()
    watching.observe(0.0, snapshot(), waiting=48)
    watching.reset()
    assert watching.observe(STALL_S, snapshot(), waiting=48).state is Liveness.LIVE
    assert watching.observe(2 * STALL_S, snapshot(), waiting=48).state is Liveness.HUNG


# ----- the watcher, with fakes -----


@dataclass
class Journal:
    """Everything the watcher did, in order."""

    events: list[str] = field(default_factory=list)


@dataclass
class FakeEngine:
    journal: Journal
    in_flight: int = 48
    awaiting_server: int = 0

    outages: list[Outage] = field(default_factory=list)

    def suspend(self, reason: str, outage: Outage | None = None) -> None:
        self.journal.events.append(f"suspend: {reason}")
        if outage is not None:
            self.outages.append(outage)
        self.in_flight = 0

    def resume(self) -> None:
        self.journal.events.append("resume engine")

    def note_restart(self, reason: str, started_at: float | None = None) -> None:
        self.journal.events.append(f"restart seen: {reason}")


@dataclass
class FakeSwitch:
    journal: Journal

    def stop_taking(self) -> None:
        self.journal.events.append("stop taking batches")

    def resume_taking(self) -> None:
        self.journal.events.append("take batches again")


@dataclass
class FakeServer:
    """Serves snapshots from a script; `hung` stops its progress; a restart or `generate` moves it."""

    journal: Journal
    current: MetricsSnapshot | Exception
    ready_failures: int = 0
    started_at: float = 1.7e9  # /server_info's startup_time

    def metrics(self) -> MetricsSnapshot:
        if isinstance(self.current, Exception):
            raise self.current
        return self.current

    def restart(self, command: str) -> None:
        self.journal.events.append(f"run {command}")
        self.current = snapshot(running=0, decode=0.0, generated=0.0)
        self.started_at += 60.0

    def wait_ready(
        self,
        target: ReadinessTarget,
        *,
        timeout_s: float,
        check: Callable[[], None],
        sleep: Callable[[float], object],
    ) -> object:
        check()
        if self.ready_failures > 0:
            self.ready_failures -= 1
            self.journal.events.append("not ready")
            raise ServerNotReady(target.url, "still 'port closed' at the deadline", None)
        self.journal.events.append("ready")
        if isinstance(self.current, MetricsSnapshot):  # the readiness completion finishes a request
            self.current = replace(self.current, requests_total=self.current.requests_total + 1)
        else:
            self.current = snapshot(running=0, decode=0.0, generated=1.0)
        return None


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    journal: Journal
    engine: FakeEngine
    server: FakeServer
    clock: FakeClock
    watcher: LivenessWatcher

    def poll_at(self, now: float) -> LivenessVerdict | None:
        self.clock.now = now
        return self.watcher.poll_once()


def rig(
    restart_command: str | None = RESTART_COMMAND, current: MetricsSnapshot | Exception | None = None
) -> Rig:
    journal = Journal()
    engine = FakeEngine(journal)
    server = FakeServer(journal, current if current is not None else snapshot())
    clock = FakeClock()
    settings = WorkerSettings(
        server_url=SERVER_URL,
        liveness_poll_s=0.0,
        liveness_stall_s=STALL_S,
        liveness_completion_stall_s=COMPLETION_STALL_S,
        server_restart_command=restart_command,
    )
    watcher = LivenessWatcher(
        engine,
        FakeSwitch(journal),
        settings,
        read_metrics=server.metrics,
        read_started_at=lambda: server.started_at,
        wait_ready=server.wait_ready,
        run_command=server.restart,
        clock=clock,
    )
    return Rig(journal, engine, server, clock, watcher)


def test_on_a_hang_the_worker_stops_taking_batches_requeues_restarts_the_server_and_resumes() -> None:
    # Given a server with 48 requests running whose counters stopped
    test = rig()
    test.poll_at(0.0)
    verdict = test.poll_at(STALL_S)
    assert verdict is not None and verdict.state is Liveness.HUNG
    # When the watcher acts on the verdict
    test.watcher.recover(verdict)
    # Then it stops taking batches before abandoning the requests in flight, restarts the server,
    # waits until it generates, and only then resumes and takes batches again
    events = test.journal.events
    assert events[0] == "stop taking batches"
    assert events[1].startswith(f"suspend: server {SERVER_URL} is hung")
    assert events[2:] == [f"run {RESTART_COMMAND}", "ready", "resume engine", "take batches again"]


def test_a_wedge_whose_requests_ran_out_of_their_timeout_is_hung_while_suspects_wait_for_the_server() -> None:
    # Given a server wedged with nothing at it any more: the requests it took ran out of a client timeout
    # shorter than the stall window and were given up, and its gauges read idle (SGLang's, refreshed at
    # the decode-log interval, may have frozen so); a suspect of this worker waits for it to answer again
    test = rig(current=snapshot(running=0, queued=0))
    test.engine.in_flight = 0
    test.engine.awaiting_server = 1
    test.poll_at(0.0)
    # When its counters stay still for the stall window
    verdict = test.poll_at(STALL_S)
    # Then the watch calls it hung: a suspect waiting on it is work waiting on it
    assert verdict is not None and verdict.state is Liveness.HUNG, verdict


def test_without_a_restart_command_the_watcher_waits_for_the_server_to_recover() -> None:
    test = rig(restart_command=None)
    test.poll_at(0.0)
    verdict = test.poll_at(STALL_S)
    assert verdict is not None
    test.server.ready_failures = 2
    test.watcher.recover(verdict)
    assert [e for e in test.journal.events if not e.startswith("suspend")] == [
        "stop taking batches",
        "not ready",
        "not ready",
        "ready",
        "resume engine",
        "take batches again",
    ]


def test_a_down_server_gets_time_to_come_back_before_it_is_restarted() -> None:
    # Given a server whose metrics stopped answering (crashed, restarting under systemd)
    test = rig(current=InferenceUnavailable("connection refused"))
    verdicts = [test.poll_at(now) for now in (0.0, 5.0, 10.0)]
    down = verdicts[-1]
    assert down is not None and down.state is Liveness.DOWN
    # When it is still not ready after a full readiness timeout, and comes back after a restart
    test.server.ready_failures = 1
    test.watcher.recover(down)
    # Then the restart command ran only after that first wait
    assert [e for e in test.journal.events if not e.startswith("suspend")] == [
        "stop taking batches",
        "not ready",
        f"run {RESTART_COMMAND}",
        "ready",
        "resume engine",
        "take batches again",
    ]


def test_after_recovering_the_watcher_judges_afresh() -> None:
    test = rig()
    test.poll_at(0.0)
    verdict = test.poll_at(STALL_S)
    assert verdict is not None
    test.watcher.recover(verdict)
    # the first snapshot after the recovery is a new baseline, not a continuation of the stall
    test.server.current = snapshot(running=48)
    first = test.poll_at(STALL_S + 1)
    assert first is not None and first.state is Liveness.LIVE
    again = test.poll_at(2 * STALL_S + 1)
    assert again is not None and again.state is Liveness.HUNG


def test_metrics_that_are_not_enabled_are_reported_once_and_never_stop_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    test = rig(current=InferenceRejected("GET http://127.0.0.1:30000/metrics answered 404", status=404))
    assert [test.poll_at(now) for now in (0.0, 5.0, 10.0, 15.0)] == [None, None, None, None]
    assert test.journal.events == []
    refusals = [r for r in caplog.records if "--enable-metrics" in r.getMessage()]
    assert len(refusals) == 1


def test_the_restart_command_is_logged_without_its_arguments(caplog: pytest.LogCaptureFixture) -> None:
    secret_command = "curl -H 'Authorization: Bearer s3cr3t' https://ops.example/restart"
    with caplog.at_level(logging.WARNING):
        run_restart_command(secret_command.replace("curl", "/nonexistent/curl"), timeout_s=5)
    assert "s3cr3t" not in caplog.text
    assert "/nonexistent/curl … (3 arguments not shown)" in caplog.text


def test_a_hang_tells_the_engine_when_the_server_last_made_progress() -> None:
    test = rig()
    test.poll_at(0.0)
    test.server.current = snapshot(decode=2000.0)  # progress, then none
    test.poll_at(10.0)
    verdict = test.poll_at(10.0 + STALL_S)
    assert verdict is not None and verdict.state is Liveness.HUNG
    test.watcher.recover(verdict)
    assert test.engine.outages == [Outage(Liveness.HUNG.value, stalled_since=10.0)]


def test_a_server_restarted_behind_the_watch_s_back_is_told_to_the_engine_even_if_it_served_nothing() -> None:
    test = rig(current=snapshot(running=0))
    test.poll_at(0.0)
    test.server.started_at += 30.0  # a crash and a restart between two polls, with nothing served since
    test.poll_at(5.0)
    assert [e for e in test.journal.events if e.startswith("restart seen")] == [
        f"restart seen: server {SERVER_URL} restarted: it started again at {test.server.started_at:.0f}"
    ]
    test.server.current = snapshot(running=0, decode=0.0, generated=0.0)  # and its counters went back
    test.poll_at(10.0)
    assert (
        test.journal.events[-1]
        == f"restart seen: server {SERVER_URL} restarted: its progress counters went back"
    )


def test_the_watch_s_own_restart_of_a_hung_server_is_not_told_again_as_a_restart() -> None:
    test = rig()
    test.poll_at(0.0)
    verdict = test.poll_at(STALL_S)
    assert verdict is not None
    test.watcher.recover(verdict)
    test.poll_at(STALL_S + 5.0)
    assert not [e for e in test.journal.events if e.startswith("restart seen")]
