"""The trials' court asks a sick server one canary at a time: the suspects waiting on one server share it."""

from __future__ import annotations

import asyncio

from core.records import SamplingSettings
from workers.generate.trials import Court, Steadiness, TrialSettings

SUSPECTS_WAITING = 39  # as many as GPU 0 held when a wedge stopped it, in the liveness benchmark at 60 s


class SlowCanary:
    """A canary the test answers when it chooses, counting the questions the server was asked."""

    def __init__(self) -> None:
        self.asked = 0
        self.first_asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def __call__(self, sampling: SamplingSettings, *, why: str) -> bool:
        self.asked += 1
        self.first_asked.set()
        await self.answer.wait()
        return False  # the server is still wedged


def test_suspects_waiting_on_a_down_server_share_one_canary_and_all_hear_its_answer() -> None:
    async def scenario() -> tuple[int, list[bool], int]:
        canary = SlowCanary()
        steadiness = Steadiness(since=asyncio.get_running_loop().time())
        court = Court(TrialSettings(), steadiness, canary, suspended=lambda: False, resumed=asyncio.Event())
        # Given many suspects that ask at once whether the server is back
        asking = [
            asyncio.ensure_future(court.canary(SamplingSettings(), f"suspect {n} waits"))
            for n in range(SUSPECTS_WAITING)
        ]
        await canary.first_asked.wait()
        asked_while_out = canary.asked
        # When the one canary out comes back unanswered
        canary.answer.set()
        answers = await asyncio.gather(*asking)
        return asked_while_out, answers, steadiness.failures

    asked, answers, failures = asyncio.run(scenario())
    # Then the server was asked once, every suspect heard "no", and the server's record has one failure
    assert asked == 1
    assert answers == [False] * SUSPECTS_WAITING
    assert failures == 1


def test_when_the_suspect_that_asked_the_canary_gives_up_the_others_ask_anew() -> None:
    async def scenario() -> bool:
        canary = SlowCanary()
        steadiness = Steadiness(since=asyncio.get_running_loop().time())
        court = Court(TrialSettings(), steadiness, canary, suspended=lambda: False, resumed=asyncio.Event())
        leaving = asyncio.ensure_future(court.canary(SamplingSettings(), "gives up"))
        staying = asyncio.ensure_future(court.canary(SamplingSettings(), "stays"))
        await canary.first_asked.wait()
        leaving.cancel()
        canary.answer.set()
        return await staying

    assert asyncio.run(scenario()) is False


def test_suspects_waiting_for_a_down_server_are_work_waiting_on_it_until_they_stop() -> None:
    async def scenario() -> tuple[set[int], int]:
        canary = SlowCanary()
        loop = asyncio.get_running_loop()
        steadiness = Steadiness(since=loop.time())
        court = Court(TrialSettings(), steadiness, canary, suspended=lambda: False, resumed=asyncio.Event())
        # Given a server that failed a request, and a suspect waiting for its control on it
        steadiness.failed(loop.time(), server_down=True)
        waiting = asyncio.ensure_future(
            court.await_control(1.0, loop.time() + 3600.0, lambda: None, SamplingSettings())
        )
        await canary.first_asked.wait()
        # When its canary comes back unanswered, and it waits to ask the next (looked at all along)
        canary.answer.set()
        seen = set()
        while canary.asked < 2:  # the court sleeps between canaries on the real clock
            seen.add(court.awaiting_server)
            await asyncio.sleep(LOOK_EVERY_S)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        return seen, court.awaiting_server

    seen, after = asyncio.run(scenario())
    # Then the suspect counts as work waiting on the server throughout, and not once it stopped waiting
    assert (seen, after) == ({1}, 0)


LOOK_EVERY_S = 0.05
