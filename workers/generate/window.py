"""The in-flight window: the server's running-request slots, shared by every batch a worker holds.

First come, first served, with one exception: a conversation resumed at a kept turn (its worker was
killed, restarted, stopped, or lost its lease, and this delivery takes it back) takes a freed slot before
every new conversation or prompt waiting. Its turns so far were paid for; a new one can wait a turn.
"""

from __future__ import annotations

import asyncio
import collections


class InFlightWindow:
    """A semaphore of `size` slots whose `first` waiters go before the others; used on one event loop."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._first: collections.deque[asyncio.Future[None]] = collections.deque()
        self._others: collections.deque[asyncio.Future[None]] = collections.deque()
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Acquirers waiting for a slot."""
        return self._waiting

    async def acquire(self, *, first: bool = False) -> None:
        if self._free > 0:  # a slot is free only while nobody waits: release hands slots to waiters
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
        for waiting in (self._first, self._others):
            while waiting:
                granted = waiting.popleft()
                if not granted.done():
                    granted.set_result(None)
                    return
        self._free += 1
