"""Longest known work first: what a prompt is expected to take, and the class of work a batch is in.

A run ends when its last request does, so the work expected to take longest should start first and the
shortest last: then, as the queue empties, the GPUs finish within about one request of each other. What
is known before anything runs: a conversation's turns (each one request, back to back in one slot), the
dataset's own answers to the turns asked (a hint of the answer's length, `Prompt.known_answer_chars`),
and the prompt's length (its prefill, ~200 times faster per token than decoding). A chunk's prompts are
batched longest first, and each batch named with the class of its longest prompt
(workers/state/batch_priority.py): classes are half-octaves of expected work, so a 2-turn conversation
goes before a 1-turn one, a 4-turn one before both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from inference.records import Prompt
from workers.state.batch_priority import LONGEST_WORK_PRIORITY, SHORTEST_WORK_PRIORITY

DEFAULT_ANSWER_TOKENS = 2048  # one turn's answer before anything is known: a thinking answer's scale
CHARS_PER_TOKEN = 4  # near enough for ordering, in any tokenizer of English text
PREFILL_TOKENS_PER_DECODE_TOKEN = 200  # a request's prefill is this much faster per token than its decode
CLASSES_PER_DOUBLING = 2  # a class per half-octave of expected work

T = TypeVar("T")


def expected_work_tokens(prompt: Prompt) -> float:
    """The decode tokens a prompt is expected to hold a slot for, its prefill counted at its speed."""
    answers = prompt.turn_count * DEFAULT_ANSWER_TOKENS + prompt.known_answer_chars / CHARS_PER_TOKEN
    prompt_chars = sum(len(message.content) for message in prompt.messages)
    return answers + prompt_chars / CHARS_PER_TOKEN / PREFILL_TOKENS_PER_DECODE_TOKEN


def work_priority(expected_tokens: float) -> int:
    """The class (a Celery priority of new work) of this much expected work: longer, lower (sooner)."""
    doublings = math.log2(max(expected_tokens, DEFAULT_ANSWER_TOKENS) / DEFAULT_ANSWER_TOKENS)
    return max(LONGEST_WORK_PRIORITY, SHORTEST_WORK_PRIORITY - math.floor(CLASSES_PER_DOUBLING * doublings))


def batched_by_turns(prompts: Sequence[Prompt], turns_per_batch: int) -> list[list[Prompt]]:
    """Consecutive prompts in batches of at most `turns_per_batch` requests each (a conversation counts
    its turns; one longer than that is a batch of its own): a batch is about the same work whatever it
    holds, so a worker holding a few batches holds a few windows' worth, conversations or not."""
    batches: list[list[Prompt]] = []
    turns = 0
    for prompt in prompts:
        if not batches or turns + prompt.turn_count > turns_per_batch:
            batches.append([])
            turns = 0
        batches[-1].append(prompt)
        turns += prompt.turn_count
    return batches


def longest_first(items: Sequence[T], prompt_of: Callable[[T], Prompt]) -> list[T]:
    """The items in order of their prompts' expected work, longest first (equal ones as given)."""
    return sorted(items, key=lambda item: expected_work_tokens(prompt_of(item)), reverse=True)
