"""Longest known work first: a prompt's expected work, its class, what the run learns of its lengths, and
the class a batch's id names."""

from __future__ import annotations

import pytest

from core.records import Message, Prompt
from producer.enqueue.work_order import (
    CHARS_PER_TOKEN,
    DEFAULT_ANSWER_TOKENS,
    MIN_TURNS_LEARNED,
    RunLengths,
    WorkPredictor,
    batched_by_turns,
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
    work = WorkPredictor()
    priorities = [work.priority(conversation(turns)) for turns in (1, 2, 4, 6, 16)]
    assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == len(priorities)
    assert priorities[0] == SHORTEST_WORK_PRIORITY


def test_the_datasets_own_long_answer_makes_a_single_prompt_more_work_than_one_without() -> None:
    work, answered = WorkPredictor(), conversation(1, answers_chars=40_000)
    assert work.expected_tokens(answered) > work.expected_tokens(conversation(1))
    assert work.priority(answered) < SHORTEST_WORK_PRIORITY


def test_a_long_prompt_counts_at_its_prefill_speed_far_below_an_answer_of_its_length() -> None:
    work, long_prompt = WorkPredictor(), conversation(1, prompt="x" * 40_000)
    assert work.expected_tokens(conversation(1)) < work.expected_tokens(long_prompt)
    assert work.priority(long_prompt) == SHORTEST_WORK_PRIORITY


@pytest.mark.parametrize("expected_turns", [0.0, 1.0, 1e12])
def test_every_expected_work_has_a_class_of_new_work(expected_turns: float) -> None:
    assert LONGEST_WORK_PRIORITY <= work_priority(expected_turns) <= SHORTEST_WORK_PRIORITY


def test_prompts_are_ordered_longest_first_equal_ones_as_given() -> None:
    given = [conversation(1, name="a"), conversation(3), conversation(1, name="b"), conversation(6)]
    assert [p.id for p in WorkPredictor().longest_first(given, lambda p: p)] == ["c6", "c3", "a1", "b1"]


def test_a_turn_weighs_what_the_runs_completions_show_once_they_hold_enough_turns() -> None:
    # Given a 2-turn conversation the dataset leaves unanswered, and a single prompt with a long answer
    two_turns, long_answer = conversation(2, name="t"), conversation(1, answers_chars=16_000, name="a")
    work = WorkPredictor()
    # before the run has shown anything, a turn is a guess and the dataset's 4,000-token answer weighs more
    assert work.longest_first([two_turns, long_answer], lambda p: p) == [long_answer, two_turns]
    # a few completions tell nothing yet
    work.learn(RunLengths(turns=MIN_TURNS_LEARNED - 1, completion_tokens=(MIN_TURNS_LEARNED - 1) * 9_000))
    assert work.turn_tokens == DEFAULT_ANSWER_TOKENS
    # When the run's completions show a turn takes 9,000 tokens (a thinking model)
    work.learn(RunLengths(turns=MIN_TURNS_LEARNED, completion_tokens=MIN_TURNS_LEARNED * 9_000))
    # Then two turns are more than one with a long answer, and the classes are counted in its turns
    assert work.turn_tokens == 9_000
    assert work.longest_first([long_answer, two_turns], lambda p: p) == [two_turns, long_answer]
    assert work.priority(conversation(1)) == SHORTEST_WORK_PRIORITY
    assert work.priority(two_turns) == SHORTEST_WORK_PRIORITY - 2


def test_a_row_the_dataset_leaves_unanswered_is_expected_to_need_the_mean_answer_of_the_answered() -> None:
    # Given a dataset answered in part: answers of 4,000 and 12,000 characters, one of 400, and one row
    # with none
    answered = [conversation(1, answers_chars=chars, name=f"a{chars}:") for chars in (4_000, 12_000, 400)]
    unanswered = conversation(1, name="none:")
    work = WorkPredictor()
    work.observe([*answered, unanswered])
    # Then the unanswered one is expected to need their mean (5,467 characters), not nothing: it goes
    # before the short one, instead of after every answered row
    assert work.answer_chars(unanswered) == pytest.approx((4_000 + 12_000 + 400) / 3)
    order = work.longest_first([unanswered, *answered], lambda p: p)
    assert [p.id for p in order] == ["a12000:1", "none:1", "a4000:1", "a400:1"]
    # and a conversation's unanswered turns each count the mean
    assert work.answer_chars(conversation(3)) == pytest.approx(3 * (4_000 + 12_000 + 400) / 3)
    assert work.expected_tokens(answered[2]) < work.expected_tokens(unanswered)
    assert work.answer_chars(answered[2]) / CHARS_PER_TOKEN == 100


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
