"""A completion is made from a chat result and gives its turns without a field copied by hand: what the
server answered reaches the completion, and the completion's answer reaches its turn, field for field."""

from __future__ import annotations

import msgspec

from core.records import (
    Answer,
    Completion,
    KeptAnswer,
    Message,
    Origin,
    Prompt,
    SamplingSettings,
    Turn,
    Usage,
)
from inference.chat_stream import ChatResult
from workers.generate.generation import build_completion


def declared(record: type[msgspec.Struct]) -> dict[str, tuple[object, object]]:
    """Each field's type and default, as msgspec reads the record."""
    info = msgspec.inspect.type_info(record)
    assert isinstance(info, msgspec.inspect.StructType)
    return {field.name: (field.type, field.default) for field in info.fields}


def test_a_completion_declares_every_field_of_a_kept_answer_with_its_type_and_default() -> None:
    kept, completion = declared(KeptAnswer), declared(Completion)
    assert {name: completion.get(name) for name in kept} == kept


def test_a_turn_is_a_kept_answer_and_the_budget_it_was_answered_with() -> None:
    assert set(declared(Turn)) - set(declared(KeptAnswer)) == {"max_tokens"}


def chat_result() -> ChatResult:
    """A result whose every field is set to something other than its default."""
    return ChatResult(
        reasoning_content="thought",
        content="answer",
        finish_reason="stop",
        usage=Usage(prompt_tokens=3, completion_tokens=5, reasoning_tokens=2),
        spec_accept_length=3.5,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5, 6, 7, 8],
        started_at=100.0,
        finished_at=102.5,
    )


def test_everything_the_server_answered_reaches_the_completion_and_its_turn() -> None:
    result = chat_result()
    sampling = SamplingSettings(max_tokens=4096)
    prompt = Prompt(id="p1", messages=[Message(role="user", content="hi")], row=1)

    completion = build_completion(prompt, result, sampling, Origin(host="h", gpu=0, server_url="u"), 2, 1)

    for name in Answer.__struct_fields__:
        assert getattr(completion, name) == getattr(result, name), name
        assert getattr(completion.as_turn(), name) == getattr(result, name), name
    assert (completion.timings.latency_s, completion.attempt, completion.budget_retries) == (2.5, 2, 1)
    assert completion.as_turn().max_tokens == 4096
