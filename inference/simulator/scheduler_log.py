"""SGLang's scheduler log lines ("Prefill batch, ..." and "Decode batch, ..."), rate-limited in wall time.

Format of the hybrid (mamba) Qwen3.5/3.6 form, `srt/managers/scheduler_components/metrics_reporter.py`.
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER_NAME = "inference.simulator.scheduler"
LOG_FORMAT = "[%(asctime)s] %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def sglang_logger() -> logging.Logger:
    """A logger writing SGLang's prefix format to stderr, independent of the root configuration."""
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


class SchedulerLog:
    """Writes the prefill and decode lines; callers ask `due(kind)` first, so that at most one line of
    each kind is written per `min_interval_wall_s` and skipped lines cost nothing to compute."""

    def __init__(self, min_interval_wall_s: float) -> None:
        self._logger = sglang_logger()
        self._min_interval_wall_s = min_interval_wall_s
        self._last_wall_s: dict[str, float] = {}

    def due(self, kind: str) -> bool:
        """True (and the clock of `kind` restarts) if a line of this kind may be written now."""
        now = time.monotonic()
        if now - self._last_wall_s.get(kind, float("-inf")) < self._min_interval_wall_s:
            return False
        self._last_wall_s[kind] = now
        return True

    def prefill(
        self,
        *,
        new_seq: int,
        new_token: int,
        cached_token: int,
        token_usage: float,
        mamba_usage: float,
        running: int,
        queued: int,
        input_throughput: float,
    ) -> None:
        self._logger.info(
            "Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: %d, full token usage: %.2f, "
            "mamba usage: %.2f, #running-req: %d, #queue-req: %d, #pending-token: 0, cuda graph: False, "
            "input throughput (token/s): %.2f",
            new_seq,
            new_token,
            cached_token,
            token_usage,
            mamba_usage,
            running,
            queued,
            input_throughput,
        )

    def decode(
        self,
        *,
        running: int,
        tokens: int,
        token_usage: float,
        mamba_usage: float,
        accept_length: float,
        accept_rate: float,
        gen_throughput: float,
        queued: int,
    ) -> None:
        self._logger.info(
            "Decode batch, #running-req: %d, #full token: %d, full token usage: %.2f, mamba num: %d, "
            "mamba usage: %.2f, accept len: %.2f, accept rate: %.2f, cuda graph: True, "
            "gen throughput (token/s): %.2f, #queue-req: %d",
            running,
            tokens,
            token_usage,
            running,
            mamba_usage,
            accept_length,
            accept_rate,
            gen_throughput,
            queued,
        )

    def info(self, message: str, *args: object) -> None:
        self._logger.info(message, *args)
