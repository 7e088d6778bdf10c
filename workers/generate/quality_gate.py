"""The quality gate: pause a run whose completions are mostly empty or truncated, before it wastes a week.

It judges the completions since the run started or was last resumed, once there are enough of them.
"""

from __future__ import annotations

import redis

from core.run_settings.model import QualityGate
from workers.state.control import PAUSED_BY_GATE, pause
from workers.state.gate_reading import read_gate


def check_quality_gate(client: redis.Redis, run: str, gate: QualityGate) -> str | None:
    """Pause the run if the gate fails; returns the reason when it did."""
    reason = read_gate(client, run, gate).failure
    if reason is not None and pause(client, run, reason, by=PAUSED_BY_GATE):
        return reason
    return None
