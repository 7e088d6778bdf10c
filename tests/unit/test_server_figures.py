"""The peer benchmark's arithmetic (benchmarks/server_figures.py) on hand-made request logs: slots busy,
the gaps between a conversation's turns, the ideal wall time, without running the benchmark."""

from __future__ import annotations

import math

import pytest

from benchmarks.server_figures import (
    finish_spread_s,
    finished,
    ideal,
    percentile,
    request_seconds,
    sending_span_of,
    slots_busy,
    span_of,
    turn_gaps,
)
from inference.simulator import RequestRecord, SimulatorSettings

RUN = "bench"


def request(
    prompt_id: str,
    received_at: float,
    finished_at: float,
    *,
    run: str = RUN,
    status: str = "ok",
    completion_tokens: int = 0,
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
) -> RequestRecord:
    return RequestRecord(
        rid=f"{run}:{prompt_id}:{round(received_at * 1000):08x}",
        messages_hash="h",
        max_tokens=None,
        max_completion_tokens=100,
        sampling={},
        stream=True,
        status=status,
        received_at=received_at,
        finished_at=finished_at,
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
    )


def test_a_server_holding_all_its_slots_from_first_arrival_to_last_end_is_fully_busy() -> None:
    # The third request waits in the queue: a server cannot be more than fully busy.
    log = [request("a", 0.0, 10.0), request("b", 0.0, 10.0), request("c", 5.0, 10.0)]
    assert slots_busy([log], slots=2) == pytest.approx(1.0)


def test_slots_left_empty_part_of_the_run_count_against_it() -> None:
    log = [request("a", 0.0, 10.0), request("b", 5.0, 10.0)]
    assert slots_busy([log], slots=2) == pytest.approx((1 * 5 + 2 * 5) / (2 * 10))


def test_every_server_is_measured_over_the_whole_run_not_its_own_part_of_it() -> None:
    # The second server is idle for the first half of the run: that half counts against it.
    first, second = [request("a", 0.0, 10.0)], [request("b", 5.0, 10.0)]
    assert span_of([first, second]).seconds == pytest.approx(10.0)
    assert slots_busy([first, second], slots=1) == pytest.approx((10 + 5) / (1 * 2 * 10))


def test_a_turn_gap_is_the_next_turns_arrival_after_the_previous_turns_end() -> None:
    log = [
        request("c1", 8.5, 9.0),  # the log is not in turn order
        request("c1", 0.0, 4.0),
        request("c1", 4.02, 8.0),
        request("c2", 1.0, 3.0),  # one turn: no gap
        request("c3", 2.0, 5.0),
        request("c3", 5.3, 6.0),
    ]
    assert sorted(turn_gaps(log)) == pytest.approx([0.02, 0.3, 0.5])


def test_a_prompt_id_with_colons_still_names_one_conversation() -> None:
    log = [request("file:row:7", 0.0, 1.0), request("file:row:7", 1.25, 2.0), request("file:row:8", 0.5, 3.0)]
    assert turn_gaps(log) == pytest.approx([0.25])


def test_only_the_runs_answered_requests_count() -> None:
    mine = request("a", 0.0, 1.0)
    log = [
        mine,
        request("a", 0.0, 1.0, run="other"),
        request("b", 0.0, 1.0, status="cancelled"),
        request("probe", 0.0, 1.0, run="silence-probe"),
    ]
    assert finished(log, RUN) == [mine]


def test_the_ideal_is_decoding_every_token_at_capacity_plus_prefilling_every_uncached_prompt_token() -> None:
    # Capacity: 10 slots × 1 token per step ÷ 0.1 s per step = 100 tokens/s per server, at speedup 2: 200.
    settings = SimulatorSettings(
        max_running_requests=10,
        accept_length=1.0,
        decode_step_base_s=0.0,
        decode_step_per_request_s=0.01,
        prefill_per_token_s=0.001,
        speedup=2.0,
    )
    first = [
        request("a", 0.0, 1.0, completion_tokens=300, prompt_tokens=1000),
        request("a2", 1.0, 2.0, prompt_tokens=1400, cached_tokens=1400 - 1000),  # a's turn 2: 1,000 new
    ]
    second = [request("b", 0.0, 1.0, completion_tokens=500)]
    result = ideal([first, second], settings)
    assert result.decode_s == pytest.approx(800 / (200 * 2))
    assert result.prefill_s == pytest.approx(2000 * 0.001 / 2.0 / 2)
    assert result.seconds == pytest.approx(2.0 + 0.5)


def test_percentiles_are_nearest_rank_and_nothing_measured_is_not_a_number() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([0.02], 0.99) == 0.02
    assert math.isnan(percentile([], 0.5))


def test_slots_busy_while_sending_leave_out_the_drain_after_the_last_arrival() -> None:
    log = [request("a", 0.0, 4.0), request("b", 0.0, 20.0), request("c", 4.0, 6.0)]
    assert sending_span_of([log]).seconds == pytest.approx(4.0)
    assert slots_busy([log], slots=2, span=sending_span_of([log])) == pytest.approx(1.0)
    assert slots_busy([log], slots=2) == pytest.approx((2 * 6 + 1 * 14) / (2 * 20))


def test_the_finish_spread_is_how_far_apart_the_servers_ran_out_of_work() -> None:
    first = [request("a", 0.0, 10.0), request("b", 1.0, 6.0)]
    second = [request("c", 0.0, 14.0)]
    assert finish_spread_s([first, second, []]) == pytest.approx(4.0)
    assert sorted(request_seconds([first, second])) == [5.0, 10.0, 14.0]
