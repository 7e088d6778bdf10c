"""The bundled sample of the local demo: reproducible, and every row a prompt."""

from __future__ import annotations

from collections import Counter

from sample_prompts_builder import SAMPLE_PATH, SAMPLE_SIZE, sample_jsonl_text

from core.records import Prompt
from intake.reading import iter_prompts


def test_the_bundled_sample_is_exactly_what_its_builder_writes() -> None:
    assert SAMPLE_PATH.read_text(encoding="utf-8") == sample_jsonl_text()


def test_every_row_of_the_bundled_sample_is_a_prompt_with_its_own_id() -> None:
    items = list(iter_prompts(str(SAMPLE_PATH)))
    prompts = [item for item in items if isinstance(item, Prompt)]
    assert len(prompts) == len(items) == SAMPLE_SIZE
    assert len({prompt.id for prompt in prompts}) == SAMPLE_SIZE


def test_the_bundled_sample_mixes_system_prompts_and_multi_turn_conversations() -> None:
    prompts = [prompt for prompt in iter_prompts(str(SAMPLE_PATH)) if isinstance(prompt, Prompt)]
    shapes = Counter(tuple(message.role for message in prompt.messages) for prompt in prompts)
    assert shapes[("user",)] > SAMPLE_SIZE // 2
    assert shapes[("user", "assistant", "user")] > 0
    assert any(roles[0] == "system" for roles in shapes)
