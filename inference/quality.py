"""The quality label of one completion: whether it is usable training data, and if not, why."""

from __future__ import annotations

from core.records import Quality

FINISH_LENGTH = "length"


def label_completion(
    *, content: str, reasoning_content: str | None, finish_reason: str, thinking_enabled: bool
) -> Quality:
    """Classify a completion the way SGLang's reasoning parser shapes it.

    With thinking on, a budget hit before `</think>` leaves everything in `reasoning_content` and
    `content == ""` (finish `length`); a model that stops inside thinking gives the same shape with
    finish `stop`, which is an empty answer, not a truncation.
    """
    answer_is_empty = not content.strip()
    has_reasoning = bool(reasoning_content and reasoning_content.strip())
    hit_budget = finish_reason == FINISH_LENGTH
    if thinking_enabled and answer_is_empty and hit_budget:
        return Quality.TRUNCATED_IN_THINKING
    if hit_budget:
        return Quality.TRUNCATED_IN_ANSWER
    if answer_is_empty:
        return Quality.EMPTY_ANSWER
    if thinking_enabled and not has_reasoning:
        return Quality.NO_REASONING
    return Quality.OK
