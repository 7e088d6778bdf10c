"""Readiness against the simulator starting as SGLang does: port closed while loading, /health 503
while warming up, then real generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.errors import ServerNotReady
from inference.readiness import Probe, ReadinessTarget, Stage, wait_until_ready
from inference.simulator import SimulatorProcess, SimulatorSettings

LOAD_S = 1.5
WARMUP_S = 1.5
PROBE_INTERVAL_S = 0.1
READY_TIMEOUT_S = 30.0


def test_a_slowly_starting_server_is_ready_only_once_it_generates(tmp_path: Path) -> None:
    # Given a simulator that loads (port closed) then warms up (/health 503)
    sim = SimulatorProcess(SimulatorSettings(load_seconds=LOAD_S, warmup_seconds=WARMUP_S, speedup=100))
    sim.start(wait=False)
    seen: list[Probe] = []
    try:
        # When we wait for it
        ready = wait_until_ready(
            ReadinessTarget(sim.url),
            timeout_s=READY_TIMEOUT_S,
            interval_s=PROBE_INTERVAL_S,
            observer=seen.append,
        )
    finally:
        sim.stop()
    # Then it went through each stage in order and was ready only after a real completion
    stages = [probe.stage for probe in seen]
    assert stages[0] is Stage.PORT_CLOSED
    assert Stage.WARMING_UP in stages
    assert stages.index(Stage.WARMING_UP) > stages.index(Stage.PORT_CLOSED)
    assert ready.stage is Stage.READY and stages[-1] is Stage.READY


def test_a_server_that_never_finishes_loading_fails_with_its_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "sglang-gpu0.log"
    log.write_text("Loading safetensors checkpoint shards:  42% Completed | 7/16\n")
    sim = SimulatorProcess(SimulatorSettings(load_seconds=READY_TIMEOUT_S * 4))
    sim.start(wait=False)
    try:
        with pytest.raises(ServerNotReady, match="42% Completed"):
            wait_until_ready(
                ReadinessTarget(sim.url, log_path=log), timeout_s=1.0, interval_s=PROBE_INTERVAL_S
            )
    finally:
        sim.kill()
