"""A run's pause on a real redis-server: created once, never overwritten, and a note that does not decode
still pauses the run."""

from __future__ import annotations

import pytest
import redis

from workers.state.control import PAUSED_BY_GATE, PAUSED_BY_UNKNOWN, pause, pause_state
from workers.state.keys import RunKeys

pytestmark = pytest.mark.integration

RUN = "paused-run"


def test_a_second_pause_keeps_the_first_reason(redis_client: redis.Redis) -> None:
    assert pause(redis_client, RUN, "by hand")

    assert not pause(redis_client, RUN, "mostly empty answers", by=PAUSED_BY_GATE)

    state = pause_state(redis_client, RUN)
    assert state is not None and state.reason == "by hand"


def test_a_pause_note_that_does_not_decode_still_pauses_the_run_and_says_so(
    redis_client: redis.Redis,
) -> None:
    redis_client.set(RunKeys(RUN).paused, b"\xff not a pause note")

    state = pause_state(redis_client, RUN)

    assert state is not None and state.by == PAUSED_BY_UNKNOWN
    assert "unreadable note" in state.reason and "not a pause note" in state.reason
