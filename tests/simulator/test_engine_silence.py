"""Against a real simulator: a request the server accepts and then leaves silent while other requests
stream is cut within the silence limit (the server aborts it and frees its slot) and tried again, and
the retry is answered; the requests around it are never cut."""

from __future__ import annotations

from collections.abc import Callable

from core.records import Origin, SamplingSettings
from inference.client import SGLangClient
from inference.client_settings import ClientSettings
from inference.simulator import SimulatorProcess
from tests.simulator.test_simulator_scheduler import running_and_queued
from tests.support.handover import Recorder
from tests.support.records import prompt
from workers.generate.generation import GenerationEngine, RetryPolicy

# The limit is 1 s, not the default 30 s, so the test takes seconds: at speedup 10 a request here
# streams a chunk every 10-20 ms, so a second of silence is still 50 chunk intervals.
SILENCE_LIMIT_S = 1.0
LATENESS_S = 1.0  # how late past the limit the cut may come on a busy test machine
SPEEDUP = 10.0  # each request streams for a second or two: others stream through the hang
WINDOW = 4
HEALTHY_PROMPTS = 11
POISON = "a poison prompt"
WAIT_S = 60.0


def test_a_request_left_silent_while_others_stream_is_cut_within_the_limit_and_answered_on_retry(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a server that hangs the first request holding the poison text, after its first chunk
    sim = start_simulator(speedup=SPEEDUP, max_running_requests=WINDOW)
    sim.admin.set_faults(prompt_faults={POISON: {"fault": "hang", "times": 1}})
    engine = GenerationEngine(
        lambda: SGLangClient(ClientSettings(server_url=sim.url)),
        max_in_flight=WINDOW,
        retry=RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_cap_s=0.01),
        origin=Origin(host="h", gpu=0, server_url=sim.url),
        silence_limit_s=SILENCE_LIMIT_S,
    )
    recorder = Recorder()
    prompts = [prompt("poison", text=POISON), *(prompt(f"healthy-{i}") for i in range(HEALTHY_PROMPTS))]
    # When a batch holding it runs among healthy prompts
    try:
        outcome = engine.submit_batch("silence", prompts, SamplingSettings(), recorder).done.result(WAIT_S)
    finally:
        engine.close()

    # Then every prompt is staged, the poison one on its second attempt, every other on its first
    assert (outcome.staged, outcome.dead_lettered, outcome.unreachable) == (len(prompts), 0, [])
    attempts = {completion.prompt_id: completion.attempt for completion in recorder.staged}
    assert attempts.pop("poison") == 2 and set(attempts.values()) == {1}
    # And the server saw the first attempt hang and end when the client cut it, about the limit after
    # its first (and only) chunk; its slot is free again
    hung, answered = sorted(
        (r for r in sim.admin.requests() if r.rid.startswith("silence:poison:")), key=lambda r: r.received_at
    )
    assert (hung.status, hung.finish_reason, answered.status) == ("hung", "abort", "ok")
    assert hung.first_token_at is not None and hung.finished_at is not None
    assert SILENCE_LIMIT_S <= hung.finished_at - hung.first_token_at < SILENCE_LIMIT_S + LATENESS_S
    assert running_and_queued(sim) == (0, 0)
