"""The in-flight window: slots handed on first come, first served, resumed conversations first."""

from __future__ import annotations

import asyncio

from workers.generate.window import InFlightWindow


async def _seated_in_order(window: InFlightWindow, firsts: set[str], names: list[str]) -> list[str]:
    seated: list[str] = []

    async def take(name: str) -> None:
        await window.acquire(first=name in firsts)
        seated.append(name)

    waiters = [asyncio.ensure_future(take(name)) for name in names]
    await asyncio.sleep(0)
    assert window.waiting == len(names)
    for _ in names:
        window.release()
        await asyncio.sleep(0)
    await asyncio.gather(*waiters)
    return seated


def test_freed_slots_go_to_resumed_conversations_first_then_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        window = InFlightWindow(1)
        await window.acquire()
        return await _seated_in_order(
            window, {"resumed-1", "resumed-2"}, ["new-1", "resumed-1", "new-2", "resumed-2"]
        )

    assert asyncio.run(scenario()) == ["resumed-1", "resumed-2", "new-1", "new-2"]


def test_a_waiter_cancelled_after_it_was_handed_a_slot_passes_the_slot_on() -> None:
    async def scenario() -> bool:
        window = InFlightWindow(1)
        await window.acquire()
        cancelled = asyncio.ensure_future(window.acquire(first=True))
        after = asyncio.ensure_future(window.acquire())
        await asyncio.sleep(0)
        window.release()  # handed to the first waiter, which is cancelled before it runs
        cancelled.cancel()
        await asyncio.sleep(0)
        await asyncio.wait_for(after, timeout=1.0)
        return window.waiting == 0

    assert asyncio.run(scenario())


def test_a_free_slot_is_taken_at_once_and_a_release_with_nobody_waiting_frees_it_again() -> None:
    async def scenario() -> None:
        window = InFlightWindow(2)
        await window.acquire()
        await window.acquire()
        window.release()
        await asyncio.wait_for(window.acquire(), timeout=1.0)

    asyncio.run(scenario())


def test_while_a_batch_arrives_free_slots_wait_for_its_resumed_conversations_and_new_work_after() -> None:
    async def scenario() -> list[str]:
        window = InFlightWindow(1)
        seated: list[str] = []

        async def take(name: str, *, first: bool) -> None:
            await window.acquire(first=first)
            seated.append(name)

        with window.arriving():
            new = asyncio.ensure_future(take("new", first=False))
            await asyncio.sleep(0)
            assert seated == []  # the slot is free, but a conversation may be arriving for it
            await take("resumed", first=True)
        window.release()
        await new
        return seated

    assert asyncio.run(scenario()) == ["resumed", "new"]
