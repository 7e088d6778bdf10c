"""Fixtures for the simulator tests: real simulator subprocesses and openai clients configured as
the workers configure theirs (explicit timeout, no retries, SGLang extras through extra_body)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from inference.simulator import SimulatorProcess, SimulatorSettings
from tests.support.simulator_client import make_client

FAST_SPEEDUP = 1000.0


@pytest.fixture(scope="session")
def fast_settings() -> SimulatorSettings:
    return SimulatorSettings(speedup=FAST_SPEEDUP, enable_metrics=True, seed=7)


@pytest.fixture(scope="session")
def simulator(fast_settings: SimulatorSettings) -> Iterator[SimulatorProcess]:
    """One fast simulator shared by the tests that change nothing on it."""
    with SimulatorProcess(fast_settings) as sim:
        yield sim


@pytest.fixture
def client(simulator: SimulatorProcess) -> Iterator[openai.OpenAI]:
    with make_client(simulator) as openai_client:
        yield openai_client


@pytest.fixture
def start_simulator() -> Iterator[Callable[..., SimulatorProcess]]:
    """Start a dedicated simulator with settings overrides; all are stopped after the test."""
    started: list[SimulatorProcess] = []

    def start(wait: bool = True, **overrides: Any) -> SimulatorProcess:
        sim = SimulatorProcess(SimulatorSettings(**{"speedup": FAST_SPEEDUP, **overrides}))
        started.append(sim)
        return sim.start(wait=wait)

    yield start
    for sim in started:
        sim.close()
