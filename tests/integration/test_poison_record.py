"""A prompt's poison record in a real Redis, through the `strike` function: bounded when written (the
oldest events go first), read back with a bound, and a record Redis holds that is not ours (an older
draftgen's JSON list, a line cut short, bytes) costs its own lines and never the events after it."""

from __future__ import annotations

import pytest
import redis

from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.poison import EVIDENCE_MAX_BYTES, Suspicion, encode_evidence

pytestmark = pytest.mark.integration

RUN = "record"


def suspicion(index: int) -> Suspicion:
    return Suspicion(life=f"h/gpu0#a.{index}", cause="dropped", with_server=True, at=1.7e9 + index)


def test_a_record_keeps_its_newest_events_within_its_byte_limit(redis_client: redis.Redis) -> None:
    ledger = RunLedger(redis_client, RUN)
    many = EVIDENCE_MAX_BYTES // len(encode_evidence(suspicion(0))) * 3
    for index in range(many):
        kept = ledger.strike("p", suspicion(index))
    stored = redis_client.hget(RunKeys(RUN).strikes, "p")
    assert stored is not None and len(stored) <= EVIDENCE_MAX_BYTES
    assert kept[-1] == suspicion(many - 1) and len(kept) < many
    assert kept == [suspicion(index) for index in range(many - len(kept), many)]  # whole lines, in order
    assert ledger.strikes_of(["p", "never-failed"]) == {"p": kept}


@pytest.mark.parametrize(
    "foreign",
    [
        b'[{"life":"h/gpu0#a.0","cause":"dropped","on_its_own":true}]',  # draftgen 0.1's strike list
        b'{"type":"suspicion","life":"h/gpu0#a.0","cau',  # a line cut short, no newline
        bytes(range(256)),
    ],
)
def test_a_record_that_is_not_ours_is_no_evidence_and_the_next_event_is_kept(
    redis_client: redis.Redis, foreign: bytes
) -> None:
    redis_client.hset(RunKeys(RUN).strikes, "p", foreign)
    ledger = RunLedger(redis_client, RUN)
    assert ledger.strike("p", suspicion(1)) == [suspicion(1)]
    assert ledger.strikes_of(["p"]) == {"p": [suspicion(1)]}
