"""The in-flight window: the server's running-request slots, shared by every batch a worker holds.

First come, first served, with one exception: a conversation resumed at a kept turn (its worker was
killed, restarted, stopped, or lost its lease, and this delivery takes it back) takes a freed slot before
every new conversation or prompt waiting. Its turns so far were paid for; a new one can wait a turn.

A batch is known to resume conversations only once their kept turns are read: while a batch `arrives`
(from its delivery until each of its prompts has asked for its slot), slots go to resumed conversations
only, so that the new prompts of a batch delivered a moment earlier (a restarted worker takes its
predecessor's batches back all at once) do not take the slots of the conversations arriving with the next.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator


class InFlightWindow:
    """A semaphore of `size` slots whose `first` waiters go before the others; used on one event loop."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._first: collections.deque[asyncio.Future[None]] = collections.deque()
        self._others: collections.deque[asyncio.Future[None]] = collections.deque()
        self._waiting = 0
        self._arriving = 0

    @property
    def waiting(self) -> int:
        """Acquirers waiting for a slot."""
        return self._waiting

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """A batch arrives: until the block ends, free slots go to `first` acquirers only."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1
            self._hand_out()

    async def acquire(self, *, first: bool = False) -> None:
        if self._free > 0 and (first or not self._arriving):  # nobody eligible waits while one is free
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._first if first else self._others
        waiting.append(granted)
        self._waiting += 1
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # handed a slot, then cancelled: pass it on
                self.release()
            raise
        finally:
            self._waiting -= 1
            if granted in waiting:
                waiting.remove(granted)

    def release(self) -> None:
        self._free += 1
        self._hand_out()

    def _hand_out(self) -> None:
        """Free slots to the waiters eligible now, first ones first."""
        eligible = (self._first,) if self._arriving else (self._first, self._others)
        for waiting in eligible:
            while self._free > 0 and waiting:
                granted = waiting.popleft()
                if not granted.done():
                    self._free -= 1
                    granted.set_result(None)
