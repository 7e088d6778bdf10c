"""A deadline for each request from the server's own decode rate: a hung request is told from a long one
in about a minute of the model's time, not after the 20-minute request timeout.

A request for up to `max_tokens` tokens cannot legitimately take much longer than `max_tokens` at the
slowest decode rate this server has shown recently. The tracker keeps the per-request decode rates of
recent completions (completion tokens / latency, from completions long enough to measure decoding)
and sets the deadline at `factor` times `max_tokens` at their 10th percentile, plus a fixed slack for
prefill and scheduling. Until it has seen enough completions it sets none: the client's request
timeout applies. The rates are wall-clock, so the deadline follows the hardware, the load and the
simulator's speedup alike. A request past its deadline is cancelled (SGLang aborts a request whose
client went away) and tried again under the usual retry policy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

DEFAULT_DEADLINE_FACTOR = 3.0  # a request's decode rate varies with the batch around it: ~2x at most
DEFAULT_DEADLINE_SLACK_S = 30.0  # prefill of a long prompt and the scheduler's turn
RATES_KEPT = 200
MIN_RATES = 20  # completions seen before any deadline is set
MIN_MEASURED_TOKENS = 256  # shorter completions say more about prefill than about decoding
SLOW_QUANTILE = 0.10


@dataclass(frozen=True)
class DeadlinePolicy:
    factor: float = DEFAULT_DEADLINE_FACTOR
    slack_s: float = DEFAULT_DEADLINE_SLACK_S


class RequestDeadlines:
    """Per-request deadlines learned from this server's recent decode rates. Used on one event loop."""

    def __init__(self, policy: DeadlinePolicy) -> None:
        self._policy = policy
        self._rates: deque[float] = deque(maxlen=RATES_KEPT)

    def observe(self, completion_tokens: int, latency_s: float) -> None:
        if completion_tokens >= MIN_MEASURED_TOKENS and latency_s > 0:
            self._rates.append(completion_tokens / latency_s)

    def slow_rate(self) -> float | None:
        """Tokens/s of a slow request lately (the 10th percentile), once enough were seen."""
        if len(self._rates) < MIN_RATES:
            return None
        ordered = sorted(self._rates)
        return ordered[int(SLOW_QUANTILE * (len(ordered) - 1))]

    def deadline_s(self, max_tokens: int) -> float | None:
        rate = self.slow_rate()
        if rate is None:
            return None
        return self._policy.factor * max_tokens / rate + self._policy.slack_s
