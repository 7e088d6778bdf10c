"""The prompts preflight sends: eight built-in ones (math, code, explanation, multi-turn), or a user's."""

from __future__ import annotations

from dataclasses import dataclass

from core.records import Message

DEFAULT_PROMPT_COUNT = 8


@dataclass(frozen=True)
class PreflightPrompt:
    name: str
    messages: list[Message]


def _user(text: str) -> Message:
    return Message(role="user", content=text)


BUILTIN_PROMPTS: tuple[PreflightPrompt, ...] = (
    PreflightPrompt(
        "math: divisors",
        [_user("What is the sum of all positive divisors of 360? Explain how you got it.")],
    ),
    PreflightPrompt(
        "math: word problem",
        [
            _user(
                "A train leaves at 9:40 and travels 212 km at 80 km/h, then 95 km at 60 km/h. "
                "At what time does it arrive?"
            )
        ],
    ),
    PreflightPrompt(
        "code: function",
        [
            _user(
                "Write a Python function that returns the n-th Fibonacci number in O(log n) time, "
                "with a short docstring and two doctests."
            )
        ],
    ),
    PreflightPrompt(
        "code: bug",
        [
            _user(
                "This function should remove duplicates from a list while keeping the order, "
                "but it is wrong. Fix it and say why:\n\n"
                "def dedup(items):\n    return list(set(items))"
            )
        ],
    ),
    PreflightPrompt(
        "explain: science",
        [_user("Explain to a twelve-year-old why the sky is blue but sunsets are red.")],
    ),
    PreflightPrompt(
        "explain: systems",
        [_user("Explain how TCP congestion control reacts to packet loss, in a few paragraphs.")],
    ),
    PreflightPrompt(
        "multi-turn: follow-up",
        [
            _user("What is a hash table?"),
            Message(
                role="assistant",
                content="A hash table maps keys to values by hashing each key to a slot in an array.",
            ),
            _user("What happens when two keys hash to the same slot, and how does that affect speed?"),
        ],
    ),
    PreflightPrompt(
        "multi-turn: system",
        [
            Message(role="system", content="You are a concise assistant for a cooking website."),
            _user("I have eggs, spinach and feta. What can I make for lunch?"),
            Message(role="assistant", content="A spinach and feta omelette is quick and filling."),
            _user("How do I keep it from going rubbery?"),
        ],
    ),
)
