"""Longest known work first: a prompt's expected work, its class, and the class a batch's id names."""

from __future__ import annotations

import pytest

from inference.records import Message, Prompt
from producer.work_order import (
    DEFAULT_ANSWER_TOKENS,
    batched_by_turns,
    expected_work_tokens,
    longest_first,
    work_priority,
)
from workers.state.batch_priority import (
    LONGEST_WORK_PRIORITY,
    SHORTEST_WORK_PRIORITY,
    UNCLASSED_BATCH_PRIORITY,
    batch_priority,
    classed_batch_id,
)
from workers.state.queues import RESUMED_BATCH_PRIORITY

UNIQUE = "0123456789abcdef"


def conversation(turns: int, *, answers_chars: int = 0, prompt: str = "q", name: str = "c") -> Prompt:
    messages = [Message(role="user", content=prompt) for _ in range(turns)]
    ends = list(range(1, turns + 1)) if turns > 1 else []
    return Prompt(id=f"{name}{turns}", messages=messages, turn_ends=ends, known_answer_chars=answers_chars)


def test_a_conversation_of_more_turns_is_more_work_and_goes_sooner() -> None:
    priorities = [work_priority(expected_work_tokens(conversation(turns))) for turns in (1, 2, 4, 6, 16)]
    assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == len(priorities)
    assert priorities[0] == SHORTEST_WORK_PRIORITY


def test_the_datasets_own_long_answer_makes_a_single_prompt_more_work_than_one_without() -> None:
    answered = conversation(1, answers_chars=40_000)
    assert expected_work_tokens(answered) > expected_work_tokens(conversation(1))
    assert work_priority(expected_work_tokens(answered)) < SHORTEST_WORK_PRIORITY


def test_a_long_prompt_counts_at_its_prefill_speed_far_below_an_answer_of_its_length() -> None:
    long_prompt = conversation(1, prompt="x" * 40_000)
    assert expected_work_tokens(conversation(1)) < expected_work_tokens(long_prompt)
    assert work_priority(expected_work_tokens(long_prompt)) == SHORTEST_WORK_PRIORITY


@pytest.mark.parametrize("expected_tokens", [0.0, DEFAULT_ANSWER_TOKENS, 1e12])
def test_every_expected_work_has_a_class_of_new_work(expected_tokens: float) -> None:
    assert LONGEST_WORK_PRIORITY <= work_priority(expected_tokens) <= SHORTEST_WORK_PRIORITY


def test_prompts_are_ordered_longest_first_equal_ones_as_given() -> None:
    given = [conversation(1, name="a"), conversation(3), conversation(1, name="b"), conversation(6)]
    assert [p.id for p in longest_first(given, lambda p: p)] == ["c6", "c3", "a1", "b1"]


def test_a_batch_holds_at_most_its_size_in_requests_a_conversation_counting_its_turns() -> None:
    given = [conversation(6, name="a"), conversation(3), conversation(2), conversation(1), conversation(8)]
    batches = batched_by_turns(given, turns_per_batch=6)
    assert [[p.id for p in batch] for batch in batches] == [["a6"], ["c3", "c2", "c1"], ["c8"]]


def test_a_batch_id_names_its_class_and_the_priority_its_message_goes_with() -> None:
    for priority in range(LONGEST_WORK_PRIORITY, SHORTEST_WORK_PRIORITY + 1):
        assert batch_priority(classed_batch_id(priority, UNIQUE)) == priority


@pytest.mark.parametrize("batch_id", [UNIQUE, "w0.abc", "w10.abc", "wx.abc", "w5", "x5.abc", "w5abc", ""])
def test_an_id_naming_no_class_goes_in_the_middle_never_before_resumed_work(batch_id: str) -> None:
    assert batch_priority(batch_id) == UNCLASSED_BATCH_PRIORITY != RESUMED_BATCH_PRIORITY


def test_new_work_never_takes_the_resumed_priority() -> None:
    with pytest.raises(ValueError, match="not 0"):
        classed_batch_id(RESUMED_BATCH_PRIORITY, UNIQUE)
