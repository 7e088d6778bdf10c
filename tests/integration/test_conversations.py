"""Whole conversations regenerated turn by turn on real Redis, real workers and the simulator: the
dataset's assistant turns never reach the server, each request holds the answers regenerated before
it, and a generate worker SIGKILLed mid-run still yields every conversation once, whole."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from core.records import Completion, DeadLetter, Quality
from core.run_settings.model import QualityGate
from devstack.local_stack import wait_until
from inference.simulator import RequestRecord, SimulatorProcess
from tests.support import prompt_files
from tests.support.records import completion
from tests.support.stack import Stack, simulators_running
from workers.state import stats_fields
from workers.state.gate_reading import read_gate
from workers.state.ledger import RunLedger
from workers.state.stats_fields import COMPLETION_TOKENS, COMPLETIONS, quality_field

pytestmark = pytest.mark.integration

CONVERSATIONS = 60
TURNS = 3
MARKER = "DATASET-ASSISTANT-TURN"
SLOW_SPEEDUP = 60.0  # a conversation lasts seconds, so the kill lands in the middle of some
FINISH_AFTER_KILL_S = 300


@pytest.fixture
def sims() -> Iterator[list[SimulatorProcess]]:
    with simulators_running(
        1, speedup=SLOW_SPEEDUP, request_log_size=20_000, log_request_messages=True
    ) as running:
        yield running


@pytest.fixture
def stack(redis_url: str, log_dir: Path, sims: list[SimulatorProcess]) -> Iterator[Stack]:
    running = Stack(redis_url, log_dir, sims)
    yield running
    running.stop()


def messages_of(record: RequestRecord) -> list[dict[str, Any]]:
    """The messages of a request the simulator logged them for: the only requests the tests keep."""
    assert record.messages is not None
    return record.messages


def marked_conversation(index: int) -> dict[str, object]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "You answer briefly."}]
    for turn in range(1, TURNS + 1):
        messages += [
            {"role": "user", "content": f"conversation {index}, question {turn}: why is the sky blue?"},
            {"role": "assistant", "content": f"{MARKER} {index}.{turn}"},
        ]
    return {"id": f"conv-{index}", "messages": messages}


def test_every_assistant_turn_is_regenerated_in_order_and_a_killed_worker_loses_no_conversation(
    stack: Stack, tmp_path: Path
) -> None:
    # Given 3-turn conversations whose own assistant turns carry a marker, on one GPU
    run = "conversations"
    data = prompt_files.write_jsonl(
        tmp_path / "chats.jsonl", [marked_conversation(i) for i in range(CONVERSATIONS)]
    )
    stack.start_generator(0)
    stack.start_uploader()
    stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--batch-size", "8")
    ledger = RunLedger(redis.Redis.from_url(stack.redis_url), run)
    # When its worker is SIGKILLed once some conversations have finished turns kept, then started again
    wait_until(
        lambda: ledger.client.hlen(ledger.keys.turns) >= 3, timeout_s=120, what="turns kept mid-conversation"
    )
    stack.generators[0].kill()
    kept_at_kill = {raw.decode() for raw in ledger.client.hkeys(ledger.keys.turns)}
    assert kept_at_kill, "the kill came when no conversation had turns kept"
    stack.start_generator(0)
    stack.wait_finished(run, timeout_s=FINISH_AFTER_KILL_S)
    assert stack.verify(run).returncode == 0
    # Then every conversation is committed once, with its three generated turns
    rows = [msgspec.convert(row, type=Completion) for row in stack.committed_rows(run)]
    assert sorted(Counter(row.prompt_id for row in rows).values()) == [1] * CONVERSATIONS
    whole = [row for row in rows if row.quality is not Quality.TRUNCATED_IN_THINKING]
    assert whole, "every conversation stopped at a truncated turn"
    assert all((row.generated_turns, row.conversation_turns) == (TURNS, TURNS) for row in whole)
    assert all(len(row.turns()) == row.generated_turns for row in rows)
    assert all(t.response_token_ids for row in rows for t in row.turns())
    # And no request the server received held a dataset's assistant turn
    requests = [
        record
        for record in stack.sims[0].admin.requests()
        if record.rid.startswith(run + ":") and record.messages is not None
    ]
    assert requests
    assert not any(
        MARKER in str(message["content"]) for record in requests for message in messages_of(record)
    )
    # And request j held the answers the committed row keeps for the turns before j
    answers = {row.prompt_id: [turn.content for turn in row.turns()] for row in rows}
    for record in requests:
        sent = [m["content"] for m in messages_of(record) if m["role"] == "assistant"]
        conversation = record.rid.split(":")[1]
        assert sent == answers[conversation][: len(sent)], record.rid
    assert {len([m for m in messages_of(r) if m["role"] == "user"]) for r in requests} == {1, 2, 3}
    # And a conversation taken over resumed at its next turn: its first was answered once, before the kill
    first_turns = Counter(
        r.rid.split(":")[1]
        for r in requests
        if r.status == "ok" and sum(m["role"] == "user" for m in messages_of(r)) == 1
    )
    assert all(first_turns[conversation] == 1 for conversation in kept_at_kill)
    # And nothing is left kept once every conversation is committed
    assert ledger.client.hlen(ledger.keys.turns) == 0


def test_a_staged_conversation_counts_every_turn_and_its_kept_turns_go(redis_client: redis.Redis) -> None:
    # Given a conversation whose first two turns were kept, the second cut off in its answer
    ledger = RunLedger(redis_client, "counted")
    first = completion("chat").as_turn()
    second = msgspec.structs.replace(first, quality=Quality.TRUNCATED_IN_ANSWER, finish_reason="length")
    assert ledger.keep_turns("chat", [first, second])
    assert [t.quality for t in ledger.kept_turns(["chat", "other"])["chat"]] == [Quality.OK, second.quality]
    # When it is staged whole after its third turn
    whole = msgspec.structs.replace(completion("chat"), earlier_turns=[first, second], conversation_turns=3)
    assert ledger.stage(whole)
    # Then the run counts one completion of three turns, each turn's label and tokens
    stats = {k.decode(): int(v) for k, v in redis_client.hgetall(ledger.keys.stats).items()}
    assert (stats[COMPLETIONS], stats[stats_fields.TURNS]) == (1, 3)
    assert stats[quality_field(Quality.TRUNCATED_IN_ANSWER)] == 1
    assert stats[quality_field(Quality.OK)] == 2
    assert stats[COMPLETION_TOKENS] == 3 * first.usage.completion_tokens
    # And the quality gate judges turns: one in three was truncated
    reading = read_gate(redis_client, "counted", QualityGate(min_completions=1))
    assert (reading.judged, reading.truncated) == (3, 1)
    # And its kept turns are gone, and a late worker's turns are not kept again
    assert ledger.kept_turns(["chat"]) == {}
    assert not ledger.keep_turns("chat", [first])
    assert ledger.kept_turns(["chat"]) == {}


def test_a_dead_lettered_conversation_leaves_no_kept_turns(redis_client: redis.Redis) -> None:
    ledger = RunLedger(redis_client, "dead-chat")
    assert ledger.keep_turns("chat", [completion("chat").as_turn()])
    letter = DeadLetter(
        prompt_id="chat", row=1, reason="rejected_by_server", error="turn 2 of 3: 400", attempts=1, turn=2
    )
    assert ledger.dead_letter(letter)
    assert ledger.kept_turns(["chat"]) == {}


def test_a_conversation_found_committed_after_redis_lost_its_writes_leaves_no_kept_turns(
    redis_client: redis.Redis,
) -> None:
    # Given turns Redis kept of a conversation whose hand-over it then forgot, though it was committed
    ledger = RunLedger(redis_client, "recovered-chat")
    assert ledger.keep_turns("chat", [completion("chat").as_turn()])
    # When recovery marks it committed, as the manifest says
    assert ledger.mark_committed(["chat"]) == 1
    # Then nothing of it is kept for a resume that will never come
    assert ledger.kept_turns(["chat"]) == {}
