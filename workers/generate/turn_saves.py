"""A conversation's finished turns, saved with the run beside its next turn, in order.

The next turn of a conversation is sent the moment the one before it ends; the save of the turns so far
(`keep_turns`, so that a later delivery resumes at the next turn) runs meanwhile on the engine's hand-over
threads. The saves of one conversation land in the order they were made (each waits for the one before),
and the conversation waits for the last before it is staged or given back: a save landing after the stage
would keep turns of a staged prompt (`KEEP_TURNS` refuses it, but the order keeps it from being tried), and
a hand-back whose last save had not landed would make the next delivery repeat a turn. A worker killed
before a save lands loses that turn only: the next delivery generates it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from core.records import Turn

Save = Callable[[list[Turn]], Awaitable[object]]


class TurnSaves:
    """The saves of one conversation's turns, used on the engine's event loop."""

    def __init__(self, save: Save) -> None:
        self._save = save
        self._last: asyncio.Task[None] | None = None

    def keep(self, turns: list[Turn]) -> None:
        """Save these turns once every save made before has landed; returns at once. Raises the error of
        an earlier save that failed (the conversation stops as it would have had the save been waited for)."""
        previous = self._last
        if previous is not None and previous.done():
            previous.result()
            previous = None
        self._last = asyncio.ensure_future(self._after(previous, list(turns)))

    async def _after(self, previous: asyncio.Task[None] | None, turns: list[Turn]) -> None:
        if previous is not None:
            await previous  # its failure is this one's: nothing after a lost save is saved
        await self._save(turns)

    async def settled(self) -> None:
        """Every save made has landed; raises the error of one that failed. A cancelled waiter leaves the
        saves to land."""
        if self._last is not None:
            await asyncio.shield(self._last)
