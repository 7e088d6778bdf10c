"""Token ids: `return_token_ids`, `return_prompt_token_ids` and the `sglext` ids (flags or headers),
consistent with the text and the usage, and refused with streaming where SGLang refuses them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from inference.simulator import EOS_TOKEN_ID, SimulatorProcess, SimulatorSettings, predict_outcome
from inference.simulator.protocol import STREAM_REFUSED_FLAGS
from inference.simulator.token_ids import (
    FILLER_TOKEN_IDS,
    IM_END_TOKEN_ID,
    IM_START_TOKEN_ID,
    NEWLINE_TOKEN_ID,
    ROLE_TOKEN_IDS,
    THINK_END_TOKEN_ID,
    THINK_START_TOKEN_ID,
    word_token_id,
)
from tests.simulator.test_simulator_streaming import raw_events
from tests.support.simulator_client import user

THINKING_ON_GENERATION_PROMPT = [
    IM_START_TOKEN_ID,
    ROLE_TOKEN_IDS["assistant"],
    NEWLINE_TOKEN_ID,
    THINK_START_TOKEN_ID,
    NEWLINE_TOKEN_ID,
]
STREAM_REFUSALS = list(STREAM_REFUSED_FLAGS)  # SGLang's messages, recorded once in the protocol


def post(
    sim: SimulatorProcess, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    response = httpx.post(sim.base_url + "/chat/completions", json=body, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def filler_ids(text: str | None) -> list[int]:
    return [FILLER_TOKEN_IDS[word] for word in (text or "").split()]


def test_return_token_ids_gives_the_templated_prompt_and_every_sampled_id_thinking_and_eos_included(
    simulator: SimulatorProcess,
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *user("Explain batching.")]

    body = post(simulator, {"messages": messages, "return_token_ids": True})

    choice, usage = body["choices"][0], body["usage"]
    prompt = [
        *(IM_START_TOKEN_ID, ROLE_TOKEN_IDS["system"], NEWLINE_TOKEN_ID),
        *(word_token_id("Be"), word_token_id("brief."), IM_END_TOKEN_ID),
        *(IM_START_TOKEN_ID, ROLE_TOKEN_IDS["user"], NEWLINE_TOKEN_ID),
        *(word_token_id("Explain"), word_token_id("batching."), IM_END_TOKEN_ID),
        *THINKING_ON_GENERATION_PROMPT,
    ]
    assert choice["prompt_token_ids"] == prompt
    assert len(prompt) == usage["prompt_tokens"]
    # the sampled ids, before the parser split them: reasoning, </think>, answer, EOS
    message = choice["message"]
    assert choice["response_token_ids"] == [
        *filler_ids(message["reasoning_content"]),
        THINK_END_TOKEN_ID,
        *filler_ids(message["content"]),
        EOS_TOKEN_ID,
    ]
    assert len(choice["response_token_ids"]) == usage["completion_tokens"]
    assert choice["response_token_ids"].index(THINK_END_TOKEN_ID) == usage["reasoning_tokens"] - 1
    assert choice["matched_stop"] == choice["response_token_ids"][-1] == IM_END_TOKEN_ID
    assert "sglext" not in body


def test_an_answer_cut_by_the_budget_has_no_eos_and_thinking_cut_by_it_has_no_think_end(
    simulator: SimulatorProcess, fast_settings: SimulatorSettings
) -> None:
    messages = user("Cut me.")
    planned = predict_outcome(fast_settings, messages)
    for budget in (planned.thinking_tokens - 1, planned.thinking_tokens + 2):
        body = post(simulator, {"messages": messages, "max_tokens": budget, "return_token_ids": True})

        choice = body["choices"][0]
        ids = choice["response_token_ids"]
        assert choice["finish_reason"] == "length"
        assert len(ids) == body["usage"]["completion_tokens"] == budget
        assert EOS_TOKEN_ID not in ids
        assert (THINK_END_TOKEN_ID in ids) == (budget > planned.thinking_tokens)


def test_a_stop_string_trims_the_text_but_keeps_the_id_of_the_token_that_matched(
    simulator: SimulatorProcess, fast_settings: SimulatorSettings
) -> None:
    messages = user("Stop on a word.")
    stop_word = (predict_outcome(fast_settings, messages).reasoning_content or "").split()[4]

    body = post(simulator, {"messages": messages, "stop": [stop_word], "return_token_ids": True})

    choice = body["choices"][0]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", stop_word)
    assert stop_word not in choice["message"]["reasoning_content"]
    assert choice["response_token_ids"] == [
        *filler_ids(choice["message"]["reasoning_content"]),
        FILLER_TOKEN_IDS[stop_word],
    ]
    assert len(choice["response_token_ids"]) == body["usage"]["completion_tokens"]


def test_thinking_off_closes_an_empty_think_block_in_the_prompt_and_samples_no_think_end(
    simulator: SimulatorProcess,
) -> None:
    body = post(
        simulator,
        {
            "messages": user("No thinking."),
            "chat_template_kwargs": {"enable_thinking": False},
            "return_token_ids": True,
        },
    )

    choice = body["choices"][0]
    assert choice["prompt_token_ids"][-2:] == [THINK_START_TOKEN_ID, THINK_END_TOKEN_ID]
    assert len(choice["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
    assert choice["response_token_ids"] == [*filler_ids(choice["message"]["content"]), EOS_TOKEN_ID]


def test_return_prompt_token_ids_alone_gives_the_prompt_ids_only(simulator: SimulatorProcess) -> None:
    body = post(
        simulator, {"messages": user("alpha beta alpha"), "max_tokens": 5, "return_prompt_token_ids": True}
    )

    choice = body["choices"][0]
    assert "response_token_ids" not in choice and "sglext" not in body
    # a word has the same id wherever it appears
    alpha, beta = FILLER_TOKEN_IDS["alpha"], word_token_id("beta")
    assert choice["prompt_token_ids"][3:6] == [alpha, beta, alpha]


@pytest.mark.parametrize(
    ("flags", "headers"),
    [
        ({"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}, {}),
        ({}, {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}),
    ],
    ids=["flags", "headers"],
)
def test_the_sglext_ids_come_with_the_flags_or_the_headers_and_match_the_choice_ids(
    simulator: SimulatorProcess, flags: dict[str, bool], headers: dict[str, str]
) -> None:
    messages = user("Ids at the response level.")
    in_choice = post(simulator, {"messages": messages, "max_tokens": 40, "return_token_ids": True})

    body = post(simulator, {"messages": messages, "max_tokens": 40, **flags}, headers)

    choice = in_choice["choices"][0]
    assert body["sglext"] == {
        "input_ids": choice["prompt_token_ids"],
        "output_ids": [choice["response_token_ids"]],
    }
    assert "prompt_token_ids" not in body["choices"][0]
    assert "response_token_ids" not in body["choices"][0]


def test_the_ids_are_the_same_on_every_request(client: openai.OpenAI) -> None:
    asked = {"return_token_ids": True}
    first, second = (
        client.chat.completions.create(model="default", messages=user("Same ids."), extra_body=asked)
        for _ in range(2)
    )
    assert first.choices[0].model_extra == second.choices[0].model_extra
    assert (first.choices[0].model_extra or {})["response_token_ids"]


@pytest.mark.parametrize(("flag", "message"), STREAM_REFUSALS, ids=[flag for flag, _ in STREAM_REFUSALS])
def test_a_stream_refuses_the_choice_level_return_flags_with_sglangs_400(
    client: openai.OpenAI, flag: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="default", messages=user("stream ids"), stream=True, extra_body={flag: True}
        )
    assert caught.value.body == {
        "object": "error",
        "message": message,
        "type": "BadRequest",
        "param": None,
        "code": 400,
    }


def test_a_stream_carries_the_sglext_ids_in_a_trailing_chunk(simulator: SimulatorProcess) -> None:
    messages = user("Stream the ids.")
    in_choice = post(simulator, {"messages": messages, "max_tokens": 30, "return_token_ids": True})

    events = raw_events(
        simulator,
        {
            "messages": messages,
            "max_tokens": 30,
            "return_input_ids_in_sglext": True,
            "return_output_ids_in_sglext": True,
        },
    )

    choice = in_choice["choices"][0]
    trailing = json.loads(events[-2])
    assert trailing["choices"] == []
    assert trailing["sglext"] == {
        "input_ids": choice["prompt_token_ids"],
        "output_ids": [choice["response_token_ids"]],
    }
