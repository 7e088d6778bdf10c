"""Longest known work first: what a prompt is expected to take, and the class of work a batch is in.

A run ends when its last request does, so the work expected to take longest should start first and the
shortest last: then, as the queue empties, the GPUs finish within about one request of each other. What
is known before anything runs: a conversation's turns (each one request, back to back in one slot), the
dataset's own answers to the turns asked (a hint of the answer's length, `Prompt.known_answer_chars`),
and the prompt's length (its prefill, ~200 times faster per token than decoding). A chunk's prompts are
batched longest first, and each batch named with the class of its longest prompt
(workers/state/batch_priority.py): classes are half-octaves of expected work, measured in turns of the
run's own length, so a 2-turn conversation goes before a 1-turn one, a 4-turn one before both.

What the run learns as it goes (`WorkPredictor`): a turn's length is the run's own mean once its
completions show it (a long enqueue reads it chunk by chunk, a re-run from the start), so a dataset
answer's weight against a turn is the target's, not a guess; and a prompt whose dataset gives no answer
is expected to need the mean answer of those that do, not none: in a dataset answered in part, the
unanswered rows would otherwise all wait for the last, however long they turn out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from core.records import Prompt
from workers.state.batch_priority import LONGEST_WORK_PRIORITY, SHORTEST_WORK_PRIORITY

DEFAULT_ANSWER_TOKENS = 2048  # one turn's answer before anything is known: a thinking answer's scale
MIN_TURNS_LEARNED = 64  # the run's completions show a turn's mean length once they hold this many turns
CHARS_PER_TOKEN = 4  # near enough for ordering, in any tokenizer of English text
PREFILL_TOKENS_PER_DECODE_TOKEN = 200  # a request's prefill is this much faster per token than its decode
CLASSES_PER_DOUBLING = 2  # a class per half-octave of expected work

T = TypeVar("T")


@dataclass(frozen=True)
class RunLengths:
    """What a run's completions so far show: the turns generated and their output tokens."""

    turns: int = 0
    completion_tokens: int = 0


class WorkPredictor:
    """A prompt's expected work, from what is known of it and what the run has shown so far. One per
    enqueue: `learn` the run's lengths and `observe` each chunk's prompts before ordering them."""

    def __init__(self) -> None:
        self.turn_tokens = float(DEFAULT_ANSWER_TOKENS)
        self._answered_chars = 0  # of the dataset's answers seen, and the turns they answer
        self._answered_turns = 0

    def learn(self, lengths: RunLengths) -> None:
        """Take a turn's length from the run's completions, once they hold enough turns to tell."""
        if lengths.turns >= MIN_TURNS_LEARNED and lengths.completion_tokens > 0:
            self.turn_tokens = lengths.completion_tokens / lengths.turns

    def observe(self, prompts: Sequence[Prompt]) -> None:
        """Count the dataset's answers among these prompts (the mean an unanswered prompt is given)."""
        for prompt in prompts:
            if prompt.known_answer_chars > 0:
                self._answered_chars += prompt.known_answer_chars
                self._answered_turns += prompt.turn_count

    def answer_chars(self, prompt: Prompt) -> float:
        """The dataset's answers to this prompt's turns, or the mean of those seen when it gives none."""
        if prompt.known_answer_chars > 0 or self._answered_turns == 0:
            return float(prompt.known_answer_chars)
        return prompt.turn_count * self._answered_chars / self._answered_turns

    def expected_tokens(self, prompt: Prompt) -> float:
        """The decode tokens a prompt is expected to hold a slot for, its prefill counted at its speed."""
        answers = prompt.turn_count * self.turn_tokens + self.answer_chars(prompt) / CHARS_PER_TOKEN
        prompt_chars = sum(len(message.content) for message in prompt.messages)
        return answers + prompt_chars / CHARS_PER_TOKEN / PREFILL_TOKENS_PER_DECODE_TOKEN

    def priority(self, prompt: Prompt) -> int:
        """The class (a Celery priority of new work) of this prompt's work: longer, lower (sooner)."""
        return work_priority(self.expected_tokens(prompt) / self.turn_tokens)

    def longest_first(self, items: Sequence[T], prompt_of: Callable[[T], Prompt]) -> list[T]:
        """The items in order of their prompts' expected work, longest first (equal ones as given)."""
        return sorted(items, key=lambda item: self.expected_tokens(prompt_of(item)), reverse=True)


def work_priority(expected_turns: float) -> int:
    """The class of this much expected work, in turns of the run's mean length: one turn or less is the
    shortest class, and every half-octave more goes one class sooner."""
    doublings = math.log2(max(expected_turns, 1.0))
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
