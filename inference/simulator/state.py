"""The per-server state every route reads, stored once in the aiohttp application."""

from __future__ import annotations

import dataclasses
import enum
import time

from aiohttp import web

from inference.simulator.engine import Engine, SimRequest
from inference.simulator.faults import FaultController
from inference.simulator.metrics import SimulatorMetrics
from inference.simulator.request_log import RequestLog
from inference.simulator.settings import SimulatorSettings


class ServerStatus(enum.Enum):
    STARTING = "Starting"  # warm-up: /health 503, /model_info 200
    UP = "Up"


@dataclasses.dataclass(eq=False)
class SimulatorState:
    settings: SimulatorSettings
    engine: Engine
    faults: FaultController
    requests: RequestLog
    metrics: SimulatorMetrics | None
    launch_command: str
    status: ServerStatus = ServerStatus.STARTING
    startup_time: float = dataclasses.field(default_factory=time.time)
    in_flight: dict[str, SimRequest] = dataclasses.field(default_factory=dict)


STATE = web.AppKey("simulator_state", SimulatorState)
