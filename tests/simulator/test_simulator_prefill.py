"""The simulator's prefill and prefix cache, on its engine: a prefill takes time in proportion to the
prompt tokens not in the server's prefix cache (SGLang's radix cache), chunked by
--chunked-prefill-size; a conversation's next turn on the same server finds its history cached; the cache
stays within the KV pool the running requests leave, dropping its least recently used leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.simulator.engine import Engine, SimRequest
from inference.simulator.process import SimulatorProcess
from inference.simulator.radix_cache import RadixCache
from inference.simulator.scheduler_log import SchedulerLog
from inference.simulator.settings import SimulatorSettings
from tests.simulator.test_simulator_scheduler import sample_value

INSTANT_SPEEDUP = 1e9  # model time is what is checked; wall time only has to pass
TOLERANCE_S = 1e-9
HISTORY_WORDS = 500
GENERATION_PROMPT_TAIL_TOKENS = 2  # `<think>` and the newline after it: the answer follows in history


def first_token_times(settings: SimulatorSettings, prompts: Sequence[Sequence[int]]) -> list[float]:
    """Model seconds from arrival to first token of each prompt, sent one after another to one idle
    server (each a 1-token request)."""

    async def run() -> list[float]:
        engine = Engine(settings, SchedulerLog(settings.log_min_interval_wall_s))
        task = asyncio.create_task(engine.run())
        times = []
        for ids in prompts:
            request = SimRequest(prompt_tokens=len(ids), target_tokens=1, streaming=False, prompt_ids=ids)
            engine.submit(request)
            await request.done.wait()
            assert request.first_token_model_s is not None
            times.append(request.first_token_model_s - request.arrival_model_s)
        engine.close()
        await task
        return times

    return asyncio.run(run())


def settings(**overrides: Any) -> SimulatorSettings:
    return SimulatorSettings(**{"speedup": INSTANT_SPEEDUP, **overrides})


def prefill_s(s: SimulatorSettings, new_tokens: int, chunks: int = 1) -> float:
    return s.prefill_base_s * chunks + s.prefill_per_token_s * new_tokens


def test_a_prefill_takes_time_in_proportion_to_the_prompt_tokens() -> None:
    s = settings()
    short, long = first_token_times(s, [range(1_000), range(10_000, 14_000)])
    assert short == pytest.approx(prefill_s(s, 1_000), abs=TOLERANCE_S)
    assert long == pytest.approx(prefill_s(s, 4_000), abs=TOLERANCE_S)


def test_a_prompt_whose_beginning_the_server_has_seen_prefills_only_the_rest() -> None:
    s = settings()
    _, extended = first_token_times(s, [range(3_000), range(4_000)])
    assert extended == pytest.approx(prefill_s(s, 1_000), abs=TOLERANCE_S)


def test_without_the_radix_cache_every_prompt_is_prefilled_whole() -> None:
    s = settings(disable_radix_cache=True)
    _, extended = first_token_times(s, [range(3_000), range(4_000)])
    assert extended == pytest.approx(prefill_s(s, 4_000), abs=TOLERANCE_S)


def test_a_prompt_longer_than_the_chunked_prefill_size_is_prefilled_in_chunks() -> None:
    s = settings(chunked_prefill_size=1_000)
    (whole,) = first_token_times(s, [range(2_500)])
    assert whole == pytest.approx(prefill_s(s, 2_500, chunks=3), abs=TOLERANCE_S)


def test_an_identical_prompt_still_computes_its_last_token() -> None:
    s = settings()
    _, again = first_token_times(s, [range(2_000), range(2_000)])
    assert again == pytest.approx(prefill_s(s, 1), abs=TOLERANCE_S)


def test_the_cache_drops_least_recently_used_leaves_to_stay_within_its_bound() -> None:
    cache = RadixCache()
    history = list(range(100))
    cache.insert([*history, *range(1_000, 1_300)])  # a conversation's first turn
    cache.insert([*history, *range(2_000, 2_300)])  # a second branch on the same history
    cache.insert(range(5_000, 5_400))  # an unrelated prompt
    assert cache.size_tokens == 100 + 300 + 300 + 400
    cache.match_prefix([*history, *range(1_000, 1_300)])  # the first turn is used again
    cache.evict(500)
    assert cache.size_tokens == 400  # two leaves went, the oldest first, and no more
    assert cache.match_prefix([*history, *range(1_000, 1_300)]) == 400  # recently used: kept
    assert cache.match_prefix([*history, *range(2_000, 2_300)]) == 100  # its branch went, not the history
    assert cache.match_prefix(range(5_000, 5_400)) == 0


def test_the_servers_cache_holds_no_more_than_the_kv_pool_left_by_the_running_requests() -> None:
    s = settings(max_total_tokens=5_000)
    prompts = [range(start, start + 2_000) for start in range(0, 20_000, 2_000)]
    times = first_token_times(s, [*prompts, prompts[-1]])

    # each new prompt is prefilled whole; the last one, repeated, is still cached (the newest survive)
    assert times[-1] == pytest.approx(prefill_s(s, 1), abs=TOLERANCE_S)
    # and the first, evicted long ago, would be prefilled whole again
    assert first_token_times(s, [*prompts, prompts[0]])[-1] == pytest.approx(
        prefill_s(s, 2_000), abs=TOLERANCE_S
    )


def test_a_conversations_next_turn_on_the_same_server_prefills_only_what_is_new(
    start_simulator: Callable[..., SimulatorProcess],
) -> None:
    # Given a conversation's first turn answered by one server
    same, fresh = (start_simulator(enable_cache_report=True, enable_metrics=True) for _ in range(2))
    first_turn = [{"role": "user", "content": " ".join(f"history{i}" for i in range(HISTORY_WORDS))}]
    first = chat(same, first_turn)
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And now?"},
    ]
    computed_before, fresh_warmed_up = prefill_computed(same), prefill_computed(fresh)

    # When its second turn goes to that server, and to a fresh one
    on_same, on_fresh = chat(same, second_turn), chat(fresh, second_turn)

    # Then the same server finds the first turn's prompt in its cache (all but the generation prompt's
    # `<think>` and newline, where the history's answer begins), the fresh one nothing
    assert on_same["usage"]["prompt_tokens_details"] == {
        "cached_tokens": first["usage"]["prompt_tokens"] - GENERATION_PROMPT_TAIL_TOKENS
    }
    assert on_fresh["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    # and computes only the rest, which its metrics show as SGLang names them
    prompt_tokens = on_same["usage"]["prompt_tokens"]
    assert prefill_computed(same) - computed_before == prompt_tokens - (
        first["usage"]["prompt_tokens"] - GENERATION_PROMPT_TAIL_TOKENS
    )
    assert prefill_computed(fresh) - fresh_warmed_up == prompt_tokens
    exposition = httpx.get(same.url + "/metrics").text
    assert 0 < sample_value(exposition, "sglang:cache_hit_rate") < 1
    assert (
        sample_value(exposition, "sglang:cached_tokens_total")
        == on_same["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    # and its request log, which benchmarks judge from, says so too
    logged = httpx.get(same.url + "/admin/requests").json()["requests"][-1]
    assert logged["cached_tokens"] == on_same["usage"]["prompt_tokens_details"]["cached_tokens"]


def chat(sim: SimulatorProcess, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": "default", "messages": messages, "max_tokens": 300}
    response = httpx.post(sim.base_url + "/chat/completions", json=body, timeout=30)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def prefill_computed(sim: SimulatorProcess) -> float:
    exposition = httpx.get(sim.url + "/metrics").text
    families = text_string_to_metric_families(exposition)
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == "sglang:realtime_tokens_total" and sample.labels.get("mode") == "prefill_compute"
    )
