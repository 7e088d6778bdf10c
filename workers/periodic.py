"""A daemon thread that does one thing every interval until stopped: heartbeats, lease renewals,
reconciliation. A failure is logged and the next turn comes as usual: a Redis blip must not end it.
Redis being unreachable, or lacking the protocol's functions, is one line (no traceback: it is not a bug,
and it repeats every turn)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from workers.errors import FunctionsMissing

log = logging.getLogger(__name__)


class PeriodicThread:
    def __init__(
        self, name: str, interval_s: float, action: Callable[[], object], *, first_at_once: bool = False
    ) -> None:
        self._name = name
        self._interval_s = interval_s
        self._action = action
        self._first_at_once = first_at_once
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        if self._first_at_once:
            self._turn()
        while not self._stopping.wait(self._interval_s):
            self._turn()

    def _turn(self) -> None:
        try:
            self._action()
        except (redis.ConnectionError, redis.TimeoutError) as error:
            log.warning("%s failed: Redis: %s; trying again in %.0f s", self._name, error, self._interval_s)
        except FunctionsMissing as error:
            log.warning("%s failed: %s; trying again in %.0f s", self._name, error, self._interval_s)
        except Exception:
            log.warning("%s failed; trying again in %.0f s", self._name, self._interval_s, exc_info=True)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float | None = None) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None
