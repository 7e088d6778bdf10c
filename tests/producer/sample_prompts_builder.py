"""Builds producer/data/sample.jsonl, the bundled prompts of the local demo, deterministically.

    .venv/bin/python tests/producer/sample_prompts_builder.py   # rewrites the file

test_producer_sample_data.py checks that the shipped file is exactly what this builds.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

SAMPLE_PATH = Path(__file__).resolve().parents[2] / "producer" / "data" / "sample.jsonl"
SAMPLE_SIZE = 300
SEED = 20240611
SHARE_WITH_SYSTEM_PROMPT = 0.1

QUESTIONS = [
    "Why is the sky blue?",
    "What causes the seasons on Earth?",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
    "Why do cats purr?",
    "How does a refrigerator keep food cold?",
    "What is a black hole?",
    "Why does bread go stale?",
    "How do bees make honey?",
    "What is inflation, in one paragraph?",
    "Why do we have leap years?",
    "How does GPS know where I am?",
    "What is the tallest mountain in the solar system?",
    "Why is the ocean salty?",
    "How do noise-cancelling headphones work?",
    "What did the Rosetta Stone help decipher?",
    "Why do onions make people cry?",
    "How does a bill become a law in a parliamentary system?",
    "What is photosynthesis?",
    "Why do airplanes leave contrails?",
]
TOPICS = [
    "the French Revolution",
    "plate tectonics",
    "public-key cryptography",
    "the water cycle",
    "compound interest",
    "the immune system",
    "supply and demand",
    "the theory of evolution",
    "how transistors work",
    "the history of the printing press",
]
EXPLAIN_TEMPLATES = [
    "Explain {topic} to a ten-year-old.",
    "Give me three surprising facts about {topic}.",
    "Summarise {topic} in five bullet points.",
    "What are common misconceptions about {topic}?",
    "Write a short quiz (3 questions, with answers) about {topic}.",
]
CODE_TASKS = [
    "reverses a linked list",
    "checks whether a string is a palindrome, ignoring punctuation",
    "merges two sorted lists",
    "parses a CSV line with quoted fields",
    "computes the n-th Fibonacci number in O(log n)",
    "finds the longest common prefix of a list of strings",
    "implements an LRU cache",
    "validates an IPv4 address",
    "flattens an arbitrarily nested list",
    "counts word frequencies in a text file",
]
LANGUAGES = ["Python", "Rust", "Go", "TypeScript", "C++", "Java"]
BUGGY_SNIPPET = (
    "def mean(values):\n"
    "    total = 0\n"
    "    for value in values:\n"
    "        total += value\n"
    "    return total / len(values) - 1\n"
)
SYSTEM_PROMPTS = [
    "You are a concise assistant. Answer in at most three sentences.",
    "You are a patient math tutor. Show every step.",
    "You are a senior software engineer reviewing code. Be direct.",
    "Always answer in French.",
]
FOLLOW_UPS = [
    "Can you make that shorter?",
    "Now give an example.",
    "Why is that the case?",
    "What would change if the numbers were doubled?",
    "Can you write that as a table?",
]
NAMES = ["Ana", "Bilal", "Chen", "Dara", "Emeka", "Freya"]
ITEMS = ["apples", "notebooks", "marbles", "tickets", "stamps"]


def _question(rng: random.Random) -> list[dict[str, str]]:
    return [{"role": "user", "content": rng.choice(QUESTIONS)}]


def _explain(rng: random.Random) -> list[dict[str, str]]:
    text = rng.choice(EXPLAIN_TEMPLATES).format(topic=rng.choice(TOPICS))
    return [{"role": "user", "content": text}]


def _arithmetic(rng: random.Random) -> list[dict[str, str]]:
    a, b, c = rng.randint(12, 999), rng.randint(12, 999), rng.randint(2, 19)
    return [{"role": "user", "content": f"What is ({a} + {b}) × {c}? Show your working."}]


def _word_problem(rng: random.Random) -> list[dict[str, str]]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    given, price = rng.randint(2, 15), rng.randint(2, 9)
    start = given + 2 * rng.randint(5, 40)  # what is left halves evenly
    text = (
        f"{name} has {start} {item}, gives away {given}, then sells half of the rest at "
        f"${price} each. How much money does {name} make?"
    )
    return [{"role": "user", "content": text}]


def _algebra(rng: random.Random) -> list[dict[str, str]]:
    a, x, b = rng.randint(2, 12), rng.randint(-20, 20), rng.randint(-50, 50)
    return [{"role": "user", "content": f"Solve for x: {a}x + {b} = {a * x + b}"}]


def _code(rng: random.Random) -> list[dict[str, str]]:
    text = f"Write a {rng.choice(LANGUAGES)} function that {rng.choice(CODE_TASKS)}. Include tests."
    return [{"role": "user", "content": text}]


def _debug(rng: random.Random) -> list[dict[str, str]]:
    text = f"This Python function returns the wrong mean. Find the bug:\n\n```python\n{BUGGY_SNIPPET}```"
    return [{"role": "user", "content": text}]


def _multi_turn(rng: random.Random) -> list[dict[str, str]]:
    first = rng.choice([_question, _explain, _arithmetic, _code])(rng)
    return [
        *first,
        {"role": "assistant", "content": "Here is a first answer; tell me if you want more detail."},
        {"role": "user", "content": rng.choice(FOLLOW_UPS)},
    ]


KINDS: list[Callable[[random.Random], list[dict[str, str]]]] = [
    _question,
    _explain,
    _arithmetic,
    _word_problem,
    _algebra,
    _code,
    _debug,
    _multi_turn,
]


def build_sample_rows() -> list[dict[str, object]]:
    rng = random.Random(SEED)
    rows: list[dict[str, object]] = []
    for index in range(SAMPLE_SIZE):
        messages = KINDS[index % len(KINDS)](rng)
        if rng.random() < SHARE_WITH_SYSTEM_PROMPT:
            messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}, *messages]
        rows.append({"id": f"sample-{index + 1:04d}", "messages": messages})
    return rows


def sample_jsonl_text() -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in build_sample_rows())


if __name__ == "__main__":
    SAMPLE_PATH.write_text(sample_jsonl_text(), encoding="utf-8")
