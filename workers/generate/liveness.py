"""Liveness of the SGLang server beside a generate worker, judged by token progress (docs/liveness.md).

`/health` is no proof of life: a hung scheduler can keep answering it. The server is hung when it
has requests (its running or queued gauges, or this worker's own requests in flight) and none of its
progress counters has moved for the stall window. It is down when `/metrics` does not answer at all.

`LivenessJudge` is the judgement as pure logic, fed timestamped snapshots. `LivenessWatcher` is the
thread that feeds it, one per generate-worker process; on a hang or an outage it stops the worker
taking batches, abandons the requests in flight (their batches go back to the queue at once), runs
the configured restart command, waits until the server generates and shows progress again, and
resumes.
"""

from __future__ import annotations

import enum
import logging
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from inference.errors import InferenceRejected, InferenceUnavailable, ServerNotReady
from inference.metrics_reader import MetricsSnapshot
from inference.readiness import DEFAULT_READY_TIMEOUT_S, ReadinessTarget, wait_until_ready
from inference.server_probe import ServerProbe
from workers.errors import ShuttingDown

log = logging.getLogger(__name__)

DOWN_AFTER_UNANSWERED_POLLS = 3
"""One unanswered scrape is noise; three in a row (15 s at the default poll) is a server that is gone."""
RESTART_COMMAND_TIMEOUT_S = 300.0
"""`systemctl restart` of a Type=simple unit returns in seconds; this bounds a command that hangs."""
RESTART_OUTPUT_LOG_CHARS = 4000
PROGRESS_AFTER_READY_TIMEOUT_S = 60.0
"""The readiness completion itself finishes a request, so the counters move within a scrape or two."""
WATCHER_STOP_TIMEOUT_S = 10.0
DEFAULT_LIVENESS_POLL_S = 5.0  # one /metrics scrape: milliseconds of the server's HTTP process
# Liveness (docs/liveness.md): a server with requests running and no token progress for this long is hung.
# SGLang 0.5.23 counts decode tokens per forward pass (realtime_tokens_total): with anything running it
# moves every few seconds. 300 s is far above that, above a 40k-token prefill or a first batch's warm-up,
# and a real hang costs at most 5 minutes of one GPU; a false alarm costs up to 48 abandoned requests.
DEFAULT_LIVENESS_STALL_S = 300.0


class LivenessConfig(Protocol):
    """What the watch reads of the worker's settings (`WorkerSettings` has it all)."""

    @property
    def server_url(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def liveness_poll_s(self) -> float: ...
    @property
    def liveness_stall_s(self) -> float: ...
    @property
    def liveness_completion_stall_s(self) -> float: ...
    @property
    def server_restart_command(self) -> str | None: ...


class Liveness(enum.Enum):
    LIVE = "live"
    HUNG = "hung"
    DOWN = "down"


@dataclass(frozen=True)
class LivenessVerdict:
    state: Liveness
    reason: str
    restarted: bool = False  # a progress counter went back since the last scrape: the server restarted


@dataclass(frozen=True)
class Outage:
    """What the watch tells the engine it suspends: the server is hung or down, and when (monotonic
    seconds) it last showed progress, when known. Trials of poison prompts are timed by it."""

    state: str  # a Liveness value
    stalled_since: float | None = None


class LivenessJudge:
    """Says whether the server is live, hung or down, from snapshots fed with the time they were taken.

    Hung: busy (requests running or queued at the server, or waiting on it from this worker: in flight, or
    a suspect's wait for a failed server to answer) and no progress counter moved for the stall window:
    `stall_s` when the server has a per-step counter, else the longer `completion_stall_s` (completion
    counters stay flat while long requests run). A server once seen with the per-step counter keeps the
    short window, restarts included: started with `--skip-server-warmup`, it shows no series until its
    first forward pass, and a hang before that pass is no reason to wait five times longer. Idle time never
    counts towards a stall. Down:
    `down_after` unanswered scrapes in a row.
    """

    def __init__(
        self, *, stall_s: float, completion_stall_s: float, down_after: int = DOWN_AFTER_UNANSWERED_POLLS
    ) -> None:
        self.stall_s = stall_s
        self.completion_stall_s = max(stall_s, completion_stall_s)
        self.down_after = down_after
        self._last: MetricsSnapshot | None = None
        self._quiet_since: float | None = None
        self._unanswered = 0
        self._step_counter_seen = False

    def reset(self) -> None:
        """Forget the history: the next snapshot is a fresh baseline (after a recovery). What kind of
        counters the server has is kept."""
        self._last = None
        self._quiet_since = None
        self._unanswered = 0

    @property
    def quiet_since(self) -> float | None:
        """When a progress counter was last seen moving (or the server idle), by the observer's clock."""
        return self._quiet_since

    def window_s(self, snapshot: MetricsSnapshot) -> float:
        return self.stall_s if self._step_counter(snapshot) else self.completion_stall_s

    def _step_counter(self, snapshot: MetricsSnapshot) -> bool:
        return self._step_counter_seen or snapshot.has_step_counter

    def observe(self, now: float, snapshot: MetricsSnapshot | None, waiting: int) -> LivenessVerdict:
        """Take one scrape (None: `/metrics` did not answer) at monotonic time `now`."""
        if snapshot is None:
            self._unanswered += 1
            if self._unanswered >= self.down_after:
                return LivenessVerdict(
                    Liveness.DOWN, f"/metrics unanswered {self._unanswered} times in a row"
                )
        else:
            self._unanswered = 0
            last = self._last
            moved = last is None or snapshot.progress != last.progress
            restarted = last is not None and any(
                after < before for after, before in zip(snapshot.progress, last.progress, strict=True)
            )
            self._last = snapshot
            self._step_counter_seen = self._step_counter(snapshot)
            if moved or not (snapshot.busy or waiting > 0):
                self._quiet_since = now
            if restarted:
                return replace(self._stall_verdict(now, waiting), restarted=True)
        return self._stall_verdict(now, waiting)

    def _stall_verdict(self, now: float, waiting: int) -> LivenessVerdict:
        last, quiet_since = self._last, self._quiet_since
        if last is None or quiet_since is None:
            return LivenessVerdict(Liveness.LIVE, "no answered scrape yet")
        quiet_s = now - quiet_since
        window_s = self.window_s(last)
        load = (
            f"{last.running_requests} running and {last.queued_requests} queued at the server, "
            f"{waiting} waiting on it from this worker"
        )
        if (last.busy or waiting > 0) and quiet_s >= window_s:
            counters = "per-step token counter" if self._step_counter(last) else "completion counters"
            return LivenessVerdict(
                Liveness.HUNG,
                f"{load}, and no progress of its {counters} for {quiet_s:.0f} s (window {window_s:.0f} s)",
            )
        return LivenessVerdict(Liveness.LIVE, f"{load}; last progress {quiet_s:.0f} s ago")


def started_at(server_info: dict[str, object] | None) -> float | None:
    """SGLang's `/server_info` `startup_time` (Unix seconds): changes each time the server starts."""
    value = None if server_info is None else server_info.get("startup_time")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class QueueSwitch(Protocol):
    """Stops and restarts this worker taking batches from its queue (a Celery consumer, in production)."""

    def stop_taking(self) -> None: ...
    def resume_taking(self) -> None: ...


class Suspendable(Protocol):
    """What the watcher needs of `workers.generate.generation.GenerationEngine`."""

    @property
    def in_flight(self) -> int: ...
    @property
    def awaiting_server(self) -> int: ...
    def suspend(self, reason: str, outage: Outage | None = None) -> None: ...
    def resume(self) -> None: ...
    def note_restart(self, reason: str, started_at: float | None = None) -> None: ...


class ReadyWaiter(Protocol):
    """`inference.readiness.wait_until_ready`: returns once the server generates, else raises."""

    def __call__(
        self,
        target: ReadinessTarget,
        *,
        timeout_s: float,
        check: Callable[[], None],
        sleep: Callable[[float], object],
    ) -> object: ...


def masked_command(command: str) -> str:
    """The program alone: its arguments may carry a token (a webhook's URL, a bearer header)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return "(an unparsable command)"
    if not words:
        return "(an empty command)"
    return words[0] + (f" … ({len(words) - 1} arguments not shown)" if len(words) > 1 else "")


def run_restart_command(command: str, timeout_s: float = RESTART_COMMAND_TIMEOUT_S) -> None:
    """Run the restart command (no shell: split with shlex), logging its exit status and output."""
    shown = masked_command(command)
    log.warning("LIVENESS: restarting the server: %s", shown)
    try:
        done = subprocess.run(
            shlex.split(command), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        log.error("LIVENESS: the restart command did not finish within %.0f s: %s", timeout_s, shown)
        return
    except (OSError, ValueError) as error:
        log.error("LIVENESS: the restart command could not run: %s: %s", shown, error)
        return
    output = (done.stdout + done.stderr).strip()[-RESTART_OUTPUT_LOG_CHARS:] or "(no output)"
    level = logging.WARNING if done.returncode == 0 else logging.ERROR
    log.log(level, "LIVENESS: the restart command exited with %d; its output:\n%s", done.returncode, output)


class LivenessWatcher:
    """Polls the server's `/metrics` every `liveness_poll_s` on a daemon thread and acts on a hang."""

    def __init__(
        self,
        engine: Suspendable,
        switch: QueueSwitch,
        settings: LivenessConfig,
        *,
        read_metrics: Callable[[], MetricsSnapshot] | None = None,
        read_started_at: Callable[[], float | None] | None = None,
        wait_ready: ReadyWaiter = wait_until_ready,
        run_command: Callable[[str], None] = run_restart_command,
        clock: Callable[[], float] = time.monotonic,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        self._engine = engine
        self._switch = switch
        self._url = settings.server_url
        self._target = ReadinessTarget(url=settings.server_url, api_key=settings.api_key)
        self._poll_s = settings.liveness_poll_s
        self._restart_command = settings.server_restart_command
        self._judge = LivenessJudge(
            stall_s=settings.liveness_stall_s, completion_stall_s=settings.liveness_completion_stall_s
        )
        probe = ServerProbe(settings.server_url, settings.api_key)
        self._read_metrics = read_metrics or probe.metrics
        self._read_started_at = read_started_at or (lambda: started_at(probe.server_info()))
        self._started_at: float | None = None
        self._wait_ready = wait_ready
        self._run_command = run_command
        self._clock = clock
        self._ready_timeout_s = ready_timeout_s
        self._stop = threading.Event()
        self._metrics_refused = False
        self._unanswered = False
        self._thread = threading.Thread(target=self._run, name="liveness-watcher", daemon=True)

    def start(self) -> LivenessWatcher:
        judge = self._judge
        log.info(
            "liveness: watching %s/metrics every %.1f s; hung after %.0f s without progress "
            "(%.0f s when it has only completion counters); restart command: %s",
            self._url,
            self._poll_s,
            judge.stall_s,
            judge.completion_stall_s,
            masked_command(self._restart_command) if self._restart_command else "none",
        )
        self._thread.start()
        return self

    def stop(self, timeout_s: float = WATCHER_STOP_TIMEOUT_S) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                verdict = self.poll_once()
                if verdict is not None and verdict.state is not Liveness.LIVE:
                    self.recover(verdict)
            except ShuttingDown:
                return
            except Exception:
                log.exception("liveness: the watcher's poll failed unexpectedly; polling on")

    def poll_once(self) -> LivenessVerdict | None:
        """Scrape once and return the judge's verdict; None when `/metrics` is refused (not enabled). A
        restart seen meanwhile (its counters went back, or it started again) is told to the engine."""
        snapshot: MetricsSnapshot | None
        try:
            snapshot = self._read_metrics()
        except InferenceRejected as error:
            if not self._metrics_refused:
                log.error(
                    "LIVENESS: cannot judge %s, its metrics are refused (%s): start the server with "
                    "--enable-metrics, or set DRAFTGEN_LIVENESS_ENABLED=0",
                    self._url,
                    error,
                )
            self._metrics_refused = True
            return None
        except InferenceUnavailable as error:
            if not self._unanswered:  # the first of a streak; the judge says DOWN if it lasts
                log.info("liveness: %s", error)
            self._unanswered = True
            snapshot = None
        else:
            self._unanswered = False
        self._metrics_refused = False
        # A suspect waiting for a failed server to answer is work waiting on it, as a request in flight is:
        # else a wedge whose requests ran out of a timeout shorter than the stall window looks idle for ever
        waiting = self._engine.in_flight + self._engine.awaiting_server
        verdict = self._judge.observe(self._clock(), snapshot, waiting)
        self._watch_start(counters_went_back=verdict.restarted)
        return verdict

    def _watch_start(self, *, counters_went_back: bool) -> None:
        """A server started again since the last poll (its `/server_info` `startup_time` moved, or its
        progress counters went back) failed, even if it served nothing in between to show it: the engine
        counts it against the server, from when it started again (Unix time, when known)."""
        started_at = self._read_started_at()
        moved = started_at is not None and self._started_at is not None and started_at != self._started_at
        if started_at is not None:
            self._started_at = started_at
        if moved or counters_went_back:
            how = f"it started again at {started_at:.0f}" if moved else "its progress counters went back"
            self._engine.note_restart(f"server {self._url} restarted: {how}", started_at if moved else None)

    def recover(self, verdict: LivenessVerdict) -> None:
        """Stop taking batches, hand back the work in flight, get the server generating, resume."""
        reason = f"server {self._url} is {verdict.state.value}: {verdict.reason}"
        log.error(
            "LIVENESS: %s. This worker stops taking batches and requeues its %d requests in flight.",
            reason,
            self._engine.in_flight,
        )
        self._switch.stop_taking()
        stalled_since = self._judge.quiet_since if verdict.state is Liveness.HUNG else None
        self._engine.suspend(reason, Outage(verdict.state.value, stalled_since))
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            # A down server is usually restarting or loading weights under its service manager: a
            # restart would only start the load over. Restart it only once it has had a full
            # readiness timeout to come back by itself.
            if verdict.state is Liveness.HUNG or attempt > 1:
                self._restart()
            if self._generating_again():
                break
            log.error(
                "LIVENESS: server %s still does not generate after %.0f s (attempt %d)",
                self._url,
                self._clock() - started,
                attempt,
            )
        self._judge.reset()
        self._started_at = self._read_started_at()  # the restart is the hang's, counted already
        self._engine.resume()
        self._switch.resume_taking()
        log.warning(
            "LIVENESS: server %s generates again after %.0f s; this worker takes batches again",
            self._url,
            self._clock() - started,
        )

    def _restart(self) -> None:
        if self._restart_command is None:
            log.warning(
                "LIVENESS: no DRAFTGEN_SERVER_RESTART_COMMAND: waiting for %s to recover by itself", self._url
            )
            return
        self._run_command(self._restart_command)

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise ShuttingDown("the liveness watcher is stopping")

    def _scrape(self) -> MetricsSnapshot | None:
        try:
            return self._read_metrics()
        except (InferenceUnavailable, InferenceRejected):
            return None

    def _generating_again(self) -> bool:
        """The server answers a real completion, and its progress counters moved since before it did."""
        baseline = self._scrape()
        try:
            self._wait_ready(
                self._target, timeout_s=self._ready_timeout_s, check=self._check_stop, sleep=self._stop.wait
            )
        except ServerNotReady as error:
            log.error("LIVENESS: %s", error)
            return False
        deadline = self._clock() + PROGRESS_AFTER_READY_TIMEOUT_S
        while True:
            snapshot = self._scrape()
            if snapshot is not None and (baseline is None or snapshot.progress != baseline.progress):
                return True
            if self._clock() >= deadline:
                log.error(
                    "LIVENESS: server %s answered a completion but its progress counters did not move "
                    "within %.0f s",
                    self._url,
                    PROGRESS_AFTER_READY_TIMEOUT_S,
                )
                return False
            if self._stop.wait(self._poll_s):
                raise ShuttingDown("the liveness watcher is stopping")
