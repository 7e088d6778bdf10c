"""Faults on demand: errors, hangs, drops, slow start, crash, whole-server hang, faults keyed by prompt
content; the admin routes."""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.server_probe import ServerProbe
from inference.simulator import AdminClient, SimulatorProcess, SimulatorSettings
from inference.simulator.prompt_faults import PromptFault, PromptFaultKind
from inference.simulator.warmup import WARMUP_NEW_TOKENS
from tests.simulator.test_simulator_scheduler import (
    poll_until,
    running_and_queued,
    sample_value,
    send_in_background,
)
from tests.support.simulator_client import make_client, user

SHORT_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def faulty_sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(SimulatorSettings(speedup=1000)) as sim:
        yield sim


@pytest.fixture
def faulty(faulty_sim: SimulatorProcess) -> Iterator[SimulatorProcess]:
    """The module's simulator, with faults cleared and the request log empty after each test."""
    yield faulty_sim
    faulty_sim.admin.clear_faults()
    faulty_sim.admin.reset_requests()


@pytest.mark.parametrize(
    ("status", "error_class", "error_type"),
    [
        (500, openai.InternalServerError, "InternalServerError"),
        (503, openai.InternalServerError, "503"),
    ],
)
def test_an_injected_error_has_sglangs_status_and_body(
    faulty: SimulatorProcess, status: int, error_class: type[openai.APIStatusError], error_type: str
) -> None:
    faulty.admin.set_faults(error_rate=1.0, error_status=status)
    with make_client(faulty) as client, pytest.raises(error_class) as caught:
        client.chat.completions.create(
            model="default", messages=user("fail"), max_tokens=5, extra_body={"rid": f"fails-{status}"}
        )
    assert caught.value.status_code == status
    assert isinstance(caught.value.body, dict)
    assert (caught.value.body["type"], caught.value.body["code"], caught.value.body["object"]) == (
        error_type,
        status,
        "error",
    )
    [record] = faulty.admin.requests(rid=f"fails-{status}")
    assert (record.status, record.http_status) == ("error", status)


def test_an_error_rate_fails_about_that_fraction(faulty: SimulatorProcess) -> None:
    faulty.admin.set_faults(error_rate=0.5)
    failures = 0
    with make_client(faulty) as client:
        for index in range(60):
            try:
                client.chat.completions.create(model="default", messages=user(f"rate {index}"), max_tokens=2)
            except openai.InternalServerError:
                failures += 1
    assert 15 <= failures <= 45


def test_a_hung_request_never_answers(faulty: SimulatorProcess) -> None:
    faulty.admin.set_faults(hang_rate=1.0)
    with make_client(faulty, timeout_s=SHORT_TIMEOUT_S) as client, pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(
            model="default", messages=user("hang"), max_tokens=5, extra_body={"rid": "hangs"}
        )
    poll_until(lambda: len(faulty.admin.requests(rid="hangs")) == 1)
    assert faulty.admin.requests(rid="hangs")[0].status == "hung"


@pytest.mark.parametrize("stream", [False, True])
def test_a_dropped_request_loses_its_connection(faulty: SimulatorProcess, stream: bool) -> None:
    faulty.admin.set_faults(drop_rate=1.0)
    # openai 2.8 raises APIConnectionError before the response, httpx's error when a stream is cut
    with make_client(faulty) as client, pytest.raises((openai.APIConnectionError, httpx.RemoteProtocolError)):
        response = client.chat.completions.create(
            model="default", messages=user("drop"), max_tokens=200, stream=stream
        )
        if stream:
            list(response)
    poll_until(lambda: any(record.status == "dropped" for record in faulty.admin.requests()))


def test_a_whole_server_hang_keeps_health_but_produces_no_token(faulty: SimulatorProcess) -> None:
    # Given a server hung while a request is in flight
    faulty.admin.set_faults(server_hang=True)
    with make_client(faulty) as client:
        call = send_in_background(client, max_tokens=50, rid="frozen")
        poll_until(lambda: faulty.admin.server_info()["simulator"]["num_queue_reqs"] == 1)
        # Then /health still says 200 and the request makes no progress
        assert faulty.admin.health_status() == 200
        call.join(timeout=SHORT_TIMEOUT_S)
        assert call.is_alive()
        # When the hang is switched off, the request completes
        faulty.admin.set_faults(server_hang=False)
        call.join(timeout=10)
    assert call.result is not None and call.result.usage.completion_tokens == 50


def test_the_admin_routes_validate_faults_and_reset_the_log(faulty: SimulatorProcess) -> None:
    response = httpx.post(faulty.url + "/admin/faults", json={"error_rate": 2}, timeout=10)
    assert response.status_code == 400
    assert httpx.post(faulty.url + "/admin/faults", json={"nonsense": 1}, timeout=10).status_code == 400
    with make_client(faulty) as client:
        for _ in range(3):
            client.chat.completions.create(model="default", messages=user("same prompt"), max_tokens=2)
    records = faulty.admin.requests()
    assert len(records) == 3 and len({record.messages_hash for record in records}) == 1
    assert faulty.admin.reset_requests() == 3
    assert faulty.admin.requests() == []


def test_a_slow_start_closes_the_port_then_answers_503_until_warm(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(wait=False, load_seconds=1.0, warmup_seconds=1.0)
    probe = AdminClient(sim.url, timeout_s=2.0)
    # While loading, the port refuses connections
    assert probe.health_status() is None
    # Then, during warm-up, /health is 503 while /model_info already answers
    poll_until(lambda: probe.health_status() == 503)
    assert httpx.get(sim.url + "/model_info", timeout=5).status_code == 200
    # Then it is healthy
    poll_until(lambda: probe.health_status() == 200)


def test_a_crash_after_n_requests_kills_the_process(start_simulator: Callable[..., SimulatorProcess]) -> None:
    sim = start_simulator(crash_after_requests=2)
    with make_client(sim) as client:
        for _ in range(2):
            assert client.chat.completions.create(model="default", messages=user("ok"), max_tokens=2).choices
        with pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(model="default", messages=user("dies"), max_tokens=2)
    assert sim.wait_for_exit(timeout_s=10) == -signal.SIGKILL


def test_a_crash_can_be_armed_while_running(start_simulator: Callable[..., SimulatorProcess]) -> None:
    sim = start_simulator()
    sim.admin.set_faults(crash_after_requests=0)
    with make_client(sim) as client, pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="default", messages=user("dies now"), max_tokens=2)
    assert sim.wait_for_exit(timeout_s=10) == -signal.SIGKILL


def stream_lines(sim: SimulatorProcess, text: str, rid: str) -> Iterator[str]:
    """The `data:` lines of a stream of `text`, read with a short timeout: a silence raises ReadTimeout."""
    with httpx.stream(
        "POST",
        sim.base_url + "/chat/completions",
        json={"messages": user(text), "max_tokens": 200, "stream": True, "rid": rid},
        timeout=SHORT_TIMEOUT_S,
    ) as response:
        yield from (line for line in response.iter_lines() if line.startswith("data: "))


def test_a_prompt_fault_hangs_every_matching_stream_after_its_first_chunk_holding_its_slot(
    faulty: SimulatorProcess,
) -> None:
    faulty.admin.set_faults(prompt_faults={"poison": "hang"})
    for attempt in range(2):
        # The matching stream gets its 200 and first chunk, then nothing more, its slot held
        lines = stream_lines(faulty, f"a poison prompt, try {attempt}", rid=f"poisoned-{attempt}")
        assert '"role":"assistant"' in next(lines)
        with pytest.raises(httpx.ReadTimeout):
            list(lines)

        # And once its client has gone, the request is logged hung and its slot is free
        def logged_hung(attempt: int = attempt) -> bool:
            return len(faulty.admin.requests(rid=f"poisoned-{attempt}")) == 1

        poll_until(logged_hung)
        assert faulty.admin.requests(rid=f"poisoned-{attempt}")[0].status == "hung"
        assert running_and_queued(faulty) == (0, 0)
    # While a prompt without the substring streams to its end
    assert list(stream_lines(faulty, "a healthy prompt", rid="healthy"))[-1] == "data: [DONE]"


def test_a_prompt_fault_for_the_first_n_matching_requests_is_spent_after_them(
    faulty: SimulatorProcess,
) -> None:
    faulty.admin.set_faults(prompt_faults={"poison": {"fault": "hang", "times": 1}})
    with make_client(faulty, timeout_s=SHORT_TIMEOUT_S) as client:
        # The first matching request hangs (not streamed: no answer at all)
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="default", messages=user("poison once"), max_tokens=5)
        assert faulty.admin.faults().prompt_faults == {}
        # And the next one, the retry, is answered
        retried = client.chat.completions.create(model="default", messages=user("poison once"), max_tokens=5)
    assert retried.choices[0].finish_reason == "length"


def test_a_drop_prompt_fault_cuts_the_connection_of_every_matching_request(faulty: SimulatorProcess) -> None:
    faulty.admin.set_faults(prompt_faults={"poison": PromptFaultKind.DROP})
    with make_client(faulty) as client:
        for stream in (False, True):
            with pytest.raises((openai.APIConnectionError, httpx.RemoteProtocolError)):
                response = client.chat.completions.create(
                    model="default", messages=user("the poison"), max_tokens=200, stream=stream
                )
                if stream:
                    list(response)
        assert client.chat.completions.create(model="default", messages=user("healthy"), max_tokens=5).choices
    dropped = [record for record in faulty.admin.requests() if record.status == "dropped"]
    assert len(dropped) == 2


def test_prompt_faults_are_set_at_start_and_validated(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(prompt_faults='{"poison": {"fault": "drop", "times": 2}, "bad": "hang"}')
    assert sim.admin.faults().prompt_faults == {
        "poison": PromptFault(fault=PromptFaultKind.DROP, times=2),
        "bad": PromptFault(fault=PromptFaultKind.HANG),
    }
    for refused in ({"poison": "explode"}, {"poison": {"fault": "hang", "times": 0}}, {"": "hang"}):
        response = httpx.post(sim.url + "/admin/faults", json={"prompt_faults": refused}, timeout=10)
        assert response.status_code == 400, refused
    with pytest.raises(ValueError, match="prompt-faults"):
        SimulatorSettings(prompt_faults="[1, 2]")


def realtime_tokens(sim: SimulatorProcess) -> float:
    exposition = httpx.get(sim.url + "/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "sglang:realtime_tokens_total"
    )


def test_a_wedge_prompt_fault_hangs_the_whole_server_as_it_takes_the_prompt_in(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a server at real speed decoding a long request
    sim = start_simulator(speedup=1.0, enable_metrics=True, prompt_faults='{"poison": "wedge"}')
    with make_client(sim) as client, make_client(sim, timeout_s=SHORT_TIMEOUT_S) as impatient:
        call = send_in_background(client, max_tokens=2000, text="a long healthy prompt")
        poll_until(lambda: realtime_tokens(sim) > 0)
        # When the poison prompt arrives
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model="default", messages=user("the poison"), max_tokens=5)
        # Then no request makes progress any more, while /health still answers 200
        frozen = realtime_tokens(sim)
        call.join(timeout=SHORT_TIMEOUT_S)
        assert call.is_alive() and realtime_tokens(sim) == frozen
        assert sim.admin.health_status() == 200 and sim.admin.faults().server_hang
        # Until the hang is lifted (a restart, in a real server)
        sim.admin.set_faults(server_hang=False)
        poll_until(lambda: realtime_tokens(sim) > frozen)


def test_a_server_wedged_by_its_very_first_request_shows_its_per_step_counter_stopped(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a server fresh from its start, which ran SGLang's warm-up request and nothing else
    sim = start_simulator(speedup=1.0, enable_metrics=True, prompt_faults='{"poison": "wedge"}')
    probe = ServerProbe(sim.url)
    fresh = probe.metrics()
    assert fresh.has_step_counter and fresh.requests_total == 1
    assert fresh.generation_tokens_total == WARMUP_NEW_TOKENS
    with make_client(sim) as client:
        # When its first request wedges it, before any forward pass of its own
        call = send_in_background(client, max_tokens=5, text="the poison")
        poll_until(lambda: probe.metrics().busy)
        # Then a liveness watch reads a busy server whose per-step counter stands still (its short window)
        call.join(timeout=SHORT_TIMEOUT_S)
        wedged = probe.metrics()
        assert call.is_alive() and wedged.has_step_counter and wedged.progress == fresh.progress
        sim.admin.set_faults(server_hang=False)
        call.join()


def test_a_wedged_server_counts_its_aborted_requests_as_aborted_and_never_as_finished(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a server wedged by a poison prompt (its scheduler answers nothing any more, aborts included)
    sim = start_simulator(speedup=1.0, enable_metrics=True, prompt_faults='{"poison": "wedge"}')
    probe = ServerProbe(sim.url)
    with make_client(sim) as client, make_client(sim, timeout_s=SHORT_TIMEOUT_S) as impatient:
        call = send_in_background(client, max_tokens=5, text="the poison")
        poll_until(lambda: probe.metrics().busy)
        wedged = probe.metrics()
        # When clients ask it questions and give up on them, as canaries do
        for _ in range(ABANDONED_QUESTIONS):
            with pytest.raises(openai.APITimeoutError):
                impatient.chat.completions.create(model="default", messages=user("canary"), max_tokens=1)
        poll_until(lambda: len(sim.admin.requests()) == ABANDONED_QUESTIONS)  # the poison is still open
        # Then the tokenizer counts every abort, and nothing reads as a finished request or progress
        metrics = httpx.get(sim.url + "/metrics", timeout=10).text
        assert sample_value(metrics, "sglang:num_aborted_requests_total") == ABANDONED_QUESTIONS
        assert probe.metrics().progress == wedged.progress
        sim.admin.set_faults(server_hang=False)
        call.join()


ABANDONED_QUESTIONS = 3


def test_a_server_started_without_its_warm_up_shows_no_per_step_counter_before_its_first_request(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(enable_metrics=True, skip_server_warmup=True)
    fresh = ServerProbe(sim.url).metrics()
    assert not fresh.has_step_counter and fresh.requests_total == 0


def test_a_crash_prompt_fault_kills_the_server_as_the_prompt_arrives(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    sim = start_simulator(prompt_faults='{"poison": "crash"}')
    with make_client(sim) as client:
        assert client.chat.completions.create(model="default", messages=user("healthy"), max_tokens=2).choices
        with pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(model="default", messages=user("the poison"), max_tokens=2)
    assert sim.wait_for_exit(timeout_s=10) == -signal.SIGKILL


def test_a_flaky_server_dies_every_few_seconds_whatever_it_serves(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    started = time.monotonic()
    sim = start_simulator(crash_every_s=1.0)
    assert sim.wait_for_exit(timeout_s=10) == -signal.SIGKILL
    assert time.monotonic() - started >= 1.0
    assert "SIGKILL 1 s after start (--crash-every-s)" in sim.log_text()


def chunk_gaps(sim: SimulatorProcess, text: str) -> list[float]:
    """The wall seconds between the chunks of a stream of `text` (read to its end)."""
    times: list[float] = []
    with httpx.stream(
        "POST",
        sim.base_url + "/chat/completions",
        json={"messages": user(text), "max_tokens": 60, "stream": True},
        timeout=10,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                times.append(time.monotonic())
    assert times, "no chunk came"
    return [later - earlier for earlier, later in itertools.pairwise(times)]


SEEN_PAUSE_SHARE = 0.8  # of a retraction's pause, as the client times it between two chunks


def retracted_total(sim: SimulatorProcess) -> float:
    return sample_value(
        httpx.get(sim.url + "/metrics", timeout=5).text, "sglang:num_retracted_requests_total"
    )


def test_a_retracted_request_goes_silent_under_load_then_completes_and_alone_is_never_retracted(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a server at real speed whose "long input" prompts are retracted for 1.5 s under load
    pause_s = 1.5
    faults = json.dumps({"long input": {"fault": "retract", "pause_s": pause_s}})
    sim = start_simulator(speedup=1.0, enable_metrics=True, prompt_faults=faults)
    # When one runs alone, it streams without a pause and is not retracted
    assert max(chunk_gaps(sim, "a long input, alone")) < pause_s / 2
    assert retracted_total(sim) == 0
    # When one runs while another request decodes, it falls silent after its first chunk, then completes
    with make_client(sim) as client:
        send_in_background(client, max_tokens=2000, text="a healthy prompt keeping the server busy")
        poll_until(lambda: running_and_queued(sim)[0] == 1)
        gaps = chunk_gaps(sim, "a long input, under load")
    assert max(gaps) >= pause_s * SEEN_PAUSE_SHARE  # the client may read the chunk before it a little late
    assert retracted_total(sim) == 1
    records = [r for r in sim.admin.requests() if r.status == "ok" and r.completion_tokens == 60]
    assert len(records) == 2  # both answered in full
