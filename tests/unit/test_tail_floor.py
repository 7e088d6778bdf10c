"""The tail's floor (benchmarks/tail_floor.py) and the length signal (benchmarks/length_signal.py) on
hand-made lengths: what any order gets at the end of a run, without running the benchmark."""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks.length_signal import hint_correlation, spearman, target_tokens, with_dataset_answers
from benchmarks.tail_floor import drain_wall_s, tail_floor
from core.records import Message, Prompt, SamplingSettings
from inference.simulator import RequestRecord, SimulatorSettings

# One slot, a step of exactly 0.1 s whatever runs, a token a step, no speedup: seconds are tokens ÷ 10.
PLAIN = SimulatorSettings(
    max_running_requests=1,
    decode_step_base_s=0.1,
    decode_step_per_request_s=0.0,
    accept_length=1.0,
    speedup=1.0,
)
SAMPLING = SamplingSettings(max_tokens=32768)


def test_one_slot_decodes_its_requests_one_after_another() -> None:
    # 11 and 21 tokens: 10 and 20 steps after each first token (which comes with the prefill).
    assert drain_wall_s([11, 21], PLAIN, gpus=1, order=[0, 1]) == pytest.approx(3.0)


def test_a_long_request_sent_last_holds_the_run_open_while_the_other_gpu_idles() -> None:
    lengths = [11, 11, 11, 31]
    last = drain_wall_s(lengths, PLAIN, gpus=2, order=[0, 1, 2, 3])
    first = drain_wall_s(lengths, PLAIN, gpus=2, order=[3, 0, 1, 2])
    assert (last, first) == pytest.approx((4.0, 3.0))


def test_fewer_running_requests_decode_faster_as_on_a_gpu() -> None:
    # A step takes 0.1 s plus 0.1 s per running request: two together step at 0.3 s, one alone at 0.2 s.
    shared = dataclasses.replace(PLAIN, max_running_requests=2, decode_step_per_request_s=0.1)
    # Both run 10 steps together (3 s), then the longer one 10 more alone (2 s).
    assert drain_wall_s([11, 21], shared, gpus=1, order=[0, 1]) == pytest.approx(5.0)


def test_knowing_every_length_beats_any_order_blind_to_them_on_a_heavy_tail() -> None:
    lengths = [10_000] * 2 + [100] * 200
    floor = tail_floor(lengths, SimulatorSettings(max_running_requests=4), gpus=2)
    assert floor.clairvoyant < floor.order_blind
    assert floor.clairvoyant == pytest.approx(floor.clairvoyant_s / floor.ideal_decode_s)


def test_spearman_is_one_for_the_same_order_and_minus_one_for_the_reverse() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 35, 90]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [9, 5, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_dataset_answers_follow_the_targets_lengths_as_closely_as_their_noise_says() -> None:
    settings = SimulatorSettings(length_mix="reasoning")
    prompts = [
        Prompt(id=f"p{i}", messages=[Message(role="user", content=f"question {i}")]) for i in range(400)
    ]
    lengths = [target_tokens(p, settings, SAMPLING) for p in prompts]
    exact = with_dataset_answers(prompts, settings, SAMPLING, sigma=0.0)
    noisy = with_dataset_answers(prompts, settings, SAMPLING, sigma=1.2)
    assert spearman([p.known_answer_chars for p in exact], lengths) == pytest.approx(1.0)
    assert 0.6 < spearman([p.known_answer_chars for p in noisy], lengths) < 0.8
    assert [p.messages for p in noisy] == [p.messages for p in prompts]  # the requests are unchanged


def test_the_hints_correlation_is_read_from_the_server_log_by_prompt() -> None:
    prompts = [Prompt(id=f"p{i}", messages=[], known_answer_chars=100 * (i + 1)) for i in range(3)]
    log = [
        RequestRecord(
            rid=f"run:p{i}:0",
            messages_hash="h",
            max_tokens=None,
            max_completion_tokens=None,
            sampling={},
            stream=True,
            completion_tokens=tokens,
        )
        for i, tokens in enumerate([5, 50, 500])
    ]
    assert hint_correlation(prompts, log, "run") == pytest.approx(1.0)
    assert math.isnan(hint_correlation(prompts, log, "another"))  # another run's requests are not these
