"""What the quality gate sees of a run: its completions since it started or was last resumed, read from
the run's counters, and whether they fail the gate. `workers.generate.quality_gate` acts on it (pauses
the run); `status` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from core.records import DeadLetterReason, Quality
from core.run_settings.model import QualityGate
from workers.state.keys import RunKeys
from workers.state.stats_fields import COMPLETIONS, TURNS, dead_field, generated_turns, quality_field

DROPPED_TRUNCATIONS = dead_field(DeadLetterReason.TRUNCATED_IN_THINKING)


@dataclass(frozen=True)
class GateReading:
    judged: int  # generated turns (a one-request completion is one) and dropped truncations since resuming
    empty_answers: int
    truncated: int
    gate: QualityGate

    @property
    def empty_answer_rate(self) -> float:
        return self.empty_answers / self.judged if self.judged else 0.0

    @property
    def truncated_rate(self) -> float:
        return self.truncated / self.judged if self.judged else 0.0

    @property
    def failure(self) -> str | None:
        """Why the run should pause, with the numbers; None when it is healthy or too early to say."""
        if self.judged < self.gate.min_completions:
            return None
        share = f"of the last {self.judged} completions"
        if self.empty_answer_rate > self.gate.max_empty_answer_rate:
            return (
                f"{self.empty_answers} {share} ({self.empty_answer_rate:.0%}) have an empty answer, "
                f"above the {self.gate.max_empty_answer_rate:.0%} limit: is thinking on, "
                "and does the model stop inside it?"
            )
        if self.truncated_rate > self.gate.max_truncated_rate:
            return (
                f"{self.truncated} {share} ({self.truncated_rate:.0%}) hit max_tokens, above the "
                f"{self.gate.max_truncated_rate:.0%} limit: raise max_tokens (thinking counts against it)"
            )
        return None


def _counts(raw: dict[bytes, bytes]) -> dict[str, int]:
    return {key.decode(): int(value) for key, value in raw.items() if value.isdigit()}


def read_gate(client: redis.Redis, run: str, gate: QualityGate) -> GateReading:
    keys = RunKeys(run)
    now = _counts(client.hgetall(keys.stats))
    base = _counts(client.hgetall(keys.gate_baseline))

    def since(field: str) -> int:
        return now.get(field, 0) - base.get(field, 0)

    dropped = since(DROPPED_TRUNCATIONS)
    return GateReading(
        judged=generated_turns({field: since(field) for field in (TURNS, COMPLETIONS)}) + dropped,
        empty_answers=since(quality_field(Quality.EMPTY_ANSWER)),
        truncated=since(quality_field(Quality.TRUNCATED_IN_THINKING))
        + since(quality_field(Quality.TRUNCATED_IN_ANSWER))
        + dropped,
        gate=gate,
    )
