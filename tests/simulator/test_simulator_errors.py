"""Every rejection, with SGLang's status and body: 400s, 401, 404, 503 queue full."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from inference.simulator import SimulatorProcess, SimulatorSettings, count_prompt_tokens, predict_outcome
from tests.simulator.test_simulator_scheduler import poll_until, running_and_queued, send_in_background
from tests.support.simulator_client import make_client, user

SMALL_CONTEXT_TOKENS = 64
AIOHTTP_DEFAULT_BODY_LIMIT_BYTES = 1024**2


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.5, "temperature must be non-negative, got -0.5."),
        ("top_p", 0.0, "top_p must be in (0, 1], got 0.0."),
        ("top_p", 1.5, "top_p must be in (0, 1], got 1.5."),
        ("min_p", 1.5, "min_p must be in [0, 1], got 1.5."),
        ("top_k", 0, "top_k must be -1 (disable), or at least 1, got 0."),
        ("top_k", -2, "top_k must be -1 (disable), or at least 1, got -2."),
        ("repetition_penalty", 0.0, "repetition_penalty must be in (0, 2], got 0.0."),
        ("repetition_penalty", 2.5, "repetition_penalty must be in (0, 2], got 2.5."),
        ("frequency_penalty", 3.0, "frequency_penalty must be in [-2, 2], got 3.0."),
        ("max_tokens", -1, "max_new_tokens must be at least 0, got -1."),
    ],
)
def test_a_bad_sampling_value_is_a_400_bad_request_error(
    client: openai.OpenAI, field: str, value: Any, message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="default", messages=user("bad"), extra_body={field: value})
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "object": "error",
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def test_empty_messages_are_rejected(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="default", messages=[])
    assert isinstance(caught.value.body, dict) and caught.value.body["message"] == "Messages cannot be empty."


@pytest.fixture(scope="module")
def small_context() -> Iterator[tuple[SimulatorProcess, SimulatorSettings]]:
    settings = SimulatorSettings(speedup=1000, context_length=SMALL_CONTEXT_TOKENS)
    with SimulatorProcess(settings) as sim:
        yield sim, sim.settings


def test_a_prompt_longer_than_the_context_is_rejected_counting_the_reserved_tokens(
    small_context: tuple[SimulatorProcess, SimulatorSettings],
) -> None:
    sim, settings = small_context
    # Given a prompt that fits the raw context but not with the 4 speculative tokens reserved
    messages = user(" ".join(["word"] * (SMALL_CONTEXT_TOKENS - 4 - count_prompt_tokens(user("")) + 1)))
    assert count_prompt_tokens(messages) < SMALL_CONTEXT_TOKENS
    expected = predict_outcome(settings, messages).context_error
    with make_client(sim) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="default", messages=messages)
    assert expected is not None and expected.startswith("The input (")
    assert isinstance(caught.value.body, dict) and caught.value.body["message"] == expected
    assert caught.value.body["type"] == "BadRequestError"


def test_a_prompt_of_several_megabytes_gets_the_context_length_400_not_a_413(
    client: openai.OpenAI, fast_settings: SimulatorSettings
) -> None:
    # Given a prompt about twice the size of aiohttp's default body limit, far past the context
    messages = user("word " * (2 * AIOHTTP_DEFAULT_BODY_LIMIT_BYTES // len("word ")))
    expected = predict_outcome(fast_settings, messages).context_error
    assert expected is not None and expected.startswith("The input (")
    # When it is sent, then the server reads it all and answers SGLang's context error
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="default", messages=messages)
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict) and caught.value.body["message"] == expected


def test_a_budget_past_the_context_is_rejected(
    small_context: tuple[SimulatorProcess, SimulatorSettings],
) -> None:
    sim, _ = small_context
    with make_client(sim) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="default", messages=user("short"), max_tokens=60)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["message"].startswith(
        "Requested token count exceeds the model's maximum context length of 64 tokens."
    )


def test_a_budget_larger_than_the_context_is_too_large(
    small_context: tuple[SimulatorProcess, SimulatorSettings],
) -> None:
    sim, _ = small_context
    with make_client(sim) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="default", messages=user("short"), max_completion_tokens=65)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["message"] == (
        "max_completion_tokens is too large: 65.This model supports at most 64 completion tokens."
    )


def test_a_non_json_content_type_is_a_400_bad_request(simulator: SimulatorProcess) -> None:
    response = httpx.post(
        simulator.base_url + "/chat/completions",
        content=b'{"messages": []}',
        headers={"Content-Type": "text/plain"},
        timeout=10,
    )
    assert response.status_code == 400
    assert response.json()["type"] == "Bad Request" and "application/json" in response.json()["message"]


def test_a_malformed_body_is_a_400_bad_request(simulator: SimulatorProcess) -> None:
    response = httpx.post(
        simulator.base_url + "/chat/completions", json={"messages": "not a list"}, timeout=10
    )
    assert response.status_code == 400 and response.json()["type"] == "Bad Request"


def test_a_rid_still_in_flight_is_rejected(start_simulator: Callable[..., SimulatorProcess]) -> None:
    # Given a hung server holding a request with rid "twice"
    sim = start_simulator(server_hang=True)
    with make_client(sim) as client:
        first = send_in_background(client, max_tokens=5, rid="twice")
        poll_until(lambda: sim.admin.server_info()["simulator"]["num_queue_reqs"] == 1)
        # When the same rid arrives again
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="default", messages=user("again"), max_tokens=5, extra_body={"rid": "twice"}
            )
        # Then it is rejected, and the first one finishes once the server resumes
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["message"] == "Duplicate request ID detected: twice"
        sim.admin.set_faults(server_hang=False)
        first.join(timeout=10)
        assert first.result is not None and first.result.id == "twice"


def test_an_api_key_is_required_everywhere_but_health_ready_and_metrics(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(api_key="secret", enable_metrics=True)
    with make_client(sim, api_key="wrong") as wrong, pytest.raises(openai.AuthenticationError) as caught:
        wrong.chat.completions.create(model="default", messages=user("key"), max_tokens=3)
    assert caught.value.status_code == 401 and caught.value.response.json() == {"error": "Unauthorized"}
    with make_client(sim, api_key="secret") as right:
        assert right.chat.completions.create(model="default", messages=user("key"), max_tokens=3).choices
    for path, status in (
        ("/health", 200),
        ("/ready", 200),
        ("/metrics", 200),
        ("/v1/models", 401),
        ("/admin/requests", 401),
        ("/admin/faults", 401),
    ):
        assert httpx.get(sim.url + path, timeout=10).status_code == status, path
    assert sim.admin.requests()  # the simulator's own admin client carries the key


def test_a_full_queue_answers_503(start_simulator: Callable[..., SimulatorProcess]) -> None:
    # Given one slot and a queue of one, both taken by long requests at real speed
    sim = start_simulator(max_running_requests=1, max_queued_requests=1, speedup=1.0)
    with make_client(sim) as client:
        held = []
        for expected in ((1, 0), (1, 1)):
            held.append(send_in_background(client, max_tokens=10_000))

            def taken(expected: tuple[int, int] = expected) -> bool:
                return running_and_queued(sim) == expected

            poll_until(taken)
        # When a third request arrives
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="default", messages=user("third"), max_tokens=5)
        # Then it gets SGLang's 503, and aborting the others ends them with finish_reason "abort"
        assert caught.value.status_code == 503
        assert caught.value.body == {
            "object": "error",
            "message": "The request queue is full.",
            "type": "503",
            "param": None,
            "code": 503,
        }
        httpx.post(sim.url + "/abort_request", json={"abort_all": True}, timeout=10)
        for thread in held:
            thread.join(timeout=10)
            assert thread.result is not None and thread.result.choices[0].finish_reason == "abort"


def test_an_unknown_route_is_fastapis_404(simulator: SimulatorProcess) -> None:
    response = httpx.get(simulator.url + "/no/such/route", timeout=10)
    assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})
    missing = httpx.get(simulator.base_url + "/models/other", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
