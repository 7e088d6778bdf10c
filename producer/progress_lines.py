"""Progress of long work as plain lines on stderr, at most one every few seconds.

Plain lines rather than a live bar: they read the same in a terminal, a log file and CI, and work
that ends within the interval prints nothing at all. Used where a command reads or writes for
minutes (enqueue of a large dataset, verify and report of a large run).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

PROGRESS_INTERVAL_S = 5.0

Item = TypeVar("Item")


class ProgressLines:
    """`update(done, total)` prints `<what>: done[/total] (elapsed)` once per interval; `finish` prints
    a last line when anything was printed before."""

    def __init__(
        self,
        what: str,
        *,
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        stream: TextIO | None = None,
    ) -> None:
        self._what = what
        self._interval_s = interval_s
        self._clock = clock
        self._stream = stream
        self._started = clock()
        self._next_at = self._started + interval_s
        self._printed = False

    def _print(self, done: int, total: int | None) -> None:
        of = f"/{total:,}" if total is not None else ""
        elapsed = self._clock() - self._started
        print(f"{self._what}: {done:,}{of} ({elapsed:.0f} s)", file=self._stream or sys.stderr, flush=True)
        self._printed = True

    def update(self, done: int, total: int | None = None) -> None:
        if self._clock() >= self._next_at:
            self._print(done, total)
            self._next_at = self._clock() + self._interval_s

    def finish(self, done: int, total: int | None = None) -> None:
        if self._printed:
            self._print(done, total)

    def counted(self, items: Iterable[Item]) -> Iterator[Item]:
        """The same items, counted as they pass."""
        done = 0
        for item in items:
            yield item
            done += 1
            self.update(done)
        self.finish(done)
