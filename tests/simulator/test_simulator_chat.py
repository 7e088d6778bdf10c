"""The chat response over real HTTP: shape, every truncation case, thinking on/off, determinism."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import httpx
import openai

from inference.simulator import (
    EOS_TOKEN_ID,
    SimulatorProcess,
    SimulatorSettings,
    count_prompt_tokens,
    predict_outcome,
)
from tests.support.simulator_client import make_client, user

THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def words(text: str | None) -> int:
    return len((text or "").split())


def extra(message: Any, name: str) -> Any:
    return (message.model_extra or {}).get(name)


def test_a_full_answer_stops_on_eos_with_reasoning_and_content_split_like_the_qwen3_parser(
    client: openai.OpenAI, fast_settings: SimulatorSettings
) -> None:
    messages = user("Explain continuous batching.")
    expected = predict_outcome(fast_settings, messages)

    response = client.chat.completions.create(model="default", messages=messages)

    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert extra(choice, "matched_stop") == EOS_TOKEN_ID
    reasoning = extra(choice.message, "reasoning_content")
    assert reasoning == expected.reasoning_content and reasoning.endswith("\n")
    assert choice.message.content == expected.content and choice.message.content.startswith("\n\n")
    assert response.usage is not None
    assert response.usage.prompt_tokens == count_prompt_tokens(messages)
    assert response.usage.completion_tokens == expected.thinking_tokens + expected.answer_tokens
    # one token per word, plus </think> and EOS
    assert response.usage.completion_tokens == words(reasoning) + 1 + words(choice.message.content) + 1
    assert extra(response.usage, "reasoning_tokens") == expected.thinking_tokens
    assert response.usage.completion_tokens_details is not None
    assert response.usage.completion_tokens_details.reasoning_tokens == expected.thinking_tokens


def test_thinking_cut_by_the_budget_leaves_content_empty(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="default", messages=user("Think hard."), max_tokens=20)

    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert extra(choice, "matched_stop") is None
    assert choice.message.content == ""
    assert words(extra(choice.message, "reasoning_content")) == 20
    assert response.usage is not None
    assert response.usage.completion_tokens == extra(response.usage, "reasoning_tokens") == 20


def test_a_budget_ending_on_the_think_end_token_gives_the_whole_reasoning_and_no_content(
    client: openai.OpenAI, fast_settings: SimulatorSettings
) -> None:
    messages = user("Stop right after thinking.")
    budget = predict_outcome(fast_settings, messages).thinking_tokens

    response = client.chat.completions.create(model="default", messages=messages, max_tokens=budget)

    choice = response.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("length", "")
    assert extra(choice.message, "reasoning_content").endswith("\n")
    assert response.usage is not None and extra(response.usage, "reasoning_tokens") == budget


def test_an_answer_cut_by_the_budget_keeps_the_whole_reasoning(
    client: openai.OpenAI, fast_settings: SimulatorSettings
) -> None:
    # Given a prompt whose answer is longer than 3 tokens
    messages = user("Answer at length.")
    planned = predict_outcome(fast_settings, messages)
    assert planned.answer_tokens > 4
    # When the budget stops 3 tokens into the answer
    budget = planned.thinking_tokens + 3
    response = client.chat.completions.create(model="default", messages=messages, max_tokens=budget)
    # Then the content holds 3 words and the reasoning is complete
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert words(choice.message.content) == 3
    assert extra(choice.message, "reasoning_content") == planned.reasoning_content
    assert response.usage is not None and response.usage.completion_tokens == budget
    assert extra(response.usage, "reasoning_tokens") == planned.thinking_tokens


def test_max_completion_tokens_wins_over_max_tokens(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default", messages=user("Both budgets."), max_tokens=30, max_completion_tokens=12
    )
    assert response.usage is not None and response.usage.completion_tokens == 12


def test_thinking_off_puts_everything_in_content_and_counts_no_reasoning(
    client: openai.OpenAI, fast_settings: SimulatorSettings
) -> None:
    messages = user("No thinking please.")
    expected = predict_outcome(fast_settings, messages, enable_thinking=False)

    response = client.chat.completions.create(model="default", messages=messages, extra_body=THINKING_OFF)

    choice = response.choices[0]
    assert extra(choice.message, "reasoning_content") is None
    assert choice.message.content == expected.content and not choice.message.content.startswith("\n")
    assert response.usage is not None
    assert extra(response.usage, "reasoning_tokens") == 0
    assert response.usage.completion_tokens_details is None
    assert response.usage.completion_tokens == words(choice.message.content) + 1


def test_reasoning_effort_none_turns_thinking_off(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default", messages=user("effort"), max_tokens=10, extra_body={"reasoning_effort": "none"}
    )
    assert extra(response.choices[0].message, "reasoning_content") is None


def test_separate_reasoning_false_keeps_the_raw_text_in_content(
    client: openai.OpenAI, fast_settings: SimulatorSettings
) -> None:
    messages = user("Raw text.")
    planned = predict_outcome(fast_settings, messages)

    response = client.chat.completions.create(
        model="default", messages=messages, extra_body={"separate_reasoning": False}
    )

    message = response.choices[0].message
    assert extra(message, "reasoning_content") is None
    assert message.content == f"{planned.reasoning_content}</think>{planned.content}"


def test_a_stop_string_ends_the_generation_trimmed_and_is_reported(
    client: openai.OpenAI, fast_settings: SimulatorSettings
) -> None:
    messages = user("Stop on a word.")
    reasoning = predict_outcome(fast_settings, messages).reasoning_content or ""
    stop_word = reasoning.split()[4]
    expected = predict_outcome(fast_settings, messages, stop=[stop_word])

    response = client.chat.completions.create(model="default", messages=messages, stop=[stop_word])

    choice = response.choices[0]
    assert (choice.finish_reason, extra(choice, "matched_stop")) == ("stop", stop_word)
    assert extra(choice.message, "reasoning_content") == expected.reasoning_content
    assert stop_word not in (expected.reasoning_content or "")
    assert choice.message.content == ""


def test_the_rid_becomes_the_id_and_the_model_is_echoed(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="any-name", messages=user("rid"), max_tokens=5, extra_body={"rid": "prompt-42-try-1"}
    )
    assert response.id == "prompt-42-try-1"
    assert response.model == "any-name"
    anonymous = client.chat.completions.create(model="default", messages=user("rid"), max_tokens=5)
    assert len(anonymous.id) == 32 and int(anonymous.id, 16) >= 0


def test_speculative_details_come_only_when_asked(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="default", messages=user("spec"), max_tokens=50)
    assert "sglext" not in (plain.model_extra or {})

    asked = client.chat.completions.create(
        model="default", messages=user("spec"), max_tokens=50, extra_body={"return_spec_tokens_details": True}
    )

    details = (asked.model_extra or {})["sglext"]["spec_tokens_details"]
    assert details["spec_verify_ct"] > 0
    assert details["spec_accept_length"] == 50 / details["spec_verify_ct"]
    assert 3.0 <= details["spec_accept_length"] <= 4.0
    assert sum(details["spec_correct_drafts_histogram"]) == details["spec_verify_ct"]


def test_the_raw_body_has_sglangs_keys(simulator: SimulatorProcess) -> None:
    body = httpx.post(
        simulator.base_url + "/chat/completions",
        timeout=10,
        json={"messages": user("raw"), "max_tokens": 8, "unknown_field": {"ignored": True}},
    ).json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "metadata"}
    assert body["object"] == "chat.completion" and body["model"] == "default"
    assert body["metadata"] == {"weight_version": "default"}
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": body["choices"][0]["message"]["reasoning_content"],
    }
    assert body["usage"]["prompt_tokens_details"] is None
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 8


def test_the_outcome_depends_only_on_the_seed_and_the_messages(
    client: openai.OpenAI, fast_settings: SimulatorSettings, start_simulator: Callable[..., SimulatorProcess]
) -> None:
    messages = user("Determinism.")
    first = client.chat.completions.create(model="default", messages=messages, temperature=1.0)
    second = client.chat.completions.create(model="default", messages=messages, temperature=0.0)
    assert first.choices[0].message == second.choices[0].message

    other_seed = dataclasses.replace(fast_settings, seed=fast_settings.seed + 1)
    with make_client(start_simulator(seed=other_seed.seed)) as other:
        third = other.chat.completions.create(model="default", messages=messages)

    assert third.choices[0].message.content == predict_outcome(other_seed, messages).content
    assert third.choices[0].message.content != first.choices[0].message.content


def test_a_configured_fraction_stops_inside_thinking_with_empty_content(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    with make_client(start_simulator(stop_in_thinking_rate=1.0)) as stopping:
        response = stopping.chat.completions.create(model="default", messages=user("Stop early."))

    choice = response.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("stop", "")
    assert extra(choice, "matched_stop") == EOS_TOKEN_ID
    assert response.usage is not None
    assert extra(response.usage, "reasoning_tokens") == response.usage.completion_tokens


def test_a_configured_fraction_thinks_nothing_and_answers(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    with make_client(start_simulator(think_nothing_rate=1.0)) as blank:
        response = blank.chat.completions.create(model="default", messages=user("Think nothing."))

    message = response.choices[0].message
    assert extra(message, "reasoning_content") is None
    assert message.content and message.content.startswith("\n\n")
    assert response.usage is not None and extra(response.usage, "reasoning_tokens") == 1


def test_sampling_fields_arrive_in_the_request_log_as_sent(
    client: openai.OpenAI, simulator: SimulatorProcess
) -> None:
    sent: dict[str, Any] = {"top_k": 20, "min_p": 0.0, "chat_template_kwargs": {"enable_thinking": True}}
    client.chat.completions.create(
        model="default",
        messages=user("Sampling."),
        max_tokens=4,
        temperature=0.6,
        top_p=0.95,
        seed=11,
        extra_body={"rid": "sampling-check", **sent},
    )

    [record] = simulator.admin.requests(rid="sampling-check")
    assert record.sampling == {"model": "default", "temperature": 0.6, "top_p": 0.95, "seed": 11, **sent}
    assert (record.max_tokens, record.status, record.completion_tokens) == (4, "ok", 4)
