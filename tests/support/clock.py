"""A clock a test moves by hand: called as `time.monotonic` is, it says `now` until the test changes it."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
