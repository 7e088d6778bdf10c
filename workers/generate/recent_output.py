"""A worker's own output over the last minute: completions staged and their output tokens.

`producer status` counts the same completions from the runs' event streams (a GPU's rows: tokens/s and
completions over the last minute, or since the run's first completion while that is more recent); this is
the worker's count of what it staged itself, over the same window: the last minute, or since its own
first completion. The worker shows it in
`celery inspect stats` and so on Flower's worker page (workers/bootsteps/heartbeat_step.py).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from workers.state.stats_fields import RATE_WINDOW_S

SECONDS_PER_MINUTE = 60.0


@dataclass(frozen=True)
class OutputRates:
    window_s: float
    completions: int
    output_tokens: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def completions_per_minute(self) -> float:
        return self.completions * SECONDS_PER_MINUTE / self.window_s if self.window_s > 0 else 0.0


class RecentOutput:
    """Thread-safe: completions are recorded on the engine's loop, read from Celery's control thread."""

    def __init__(
        self, *, window_s: float = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        self._first_s: float | None = None
        self._staged: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def record(self, output_tokens: int) -> None:
        now = self._clock()
        with self._lock:
            if self._first_s is None:
                self._first_s = now
            self._staged.append((now, output_tokens))
            self._forget_before(now - self._window_s)

    def rates(self) -> OutputRates:
        now = self._clock()
        with self._lock:
            self._forget_before(now - self._window_s)
            tokens = sum(count for _, count in self._staged)
            completions = len(self._staged)
            since_s = self._window_s if self._first_s is None else now - self._first_s
        return OutputRates(min(self._window_s, since_s), completions, tokens)

    def _forget_before(self, oldest_s: float) -> None:
        while self._staged and self._staged[0][0] < oldest_s:
            self._staged.popleft()
