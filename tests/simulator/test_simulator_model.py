"""The pure parts: the thinking model's distributions and determinism, prompt counting, the
settings' round trip through the command line, and the calibration of the throughput model."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys

import pytest

from inference.simulator import SimulatorSettings, count_prompt_tokens, predict_outcome, settings_to_argv
from inference.simulator.settings import add_settings_arguments, settings_from_args
from tests.support.simulator_client import user

SAMPLE_PROMPTS = 1500


def test_lengths_average_near_2300_tokens_with_a_tail_past_4096() -> None:
    settings = SimulatorSettings()
    totals = [
        predict_outcome(settings, user(f"prompt number {index}")).completion_tokens
        for index in range(SAMPLE_PROMPTS)
    ]
    assert 2100 <= statistics.mean(totals) <= 2500
    assert 0.01 <= sum(total > 4096 for total in totals) / len(totals) <= 0.15


def test_an_outcome_depends_on_the_seed_and_the_messages_only() -> None:
    settings = SimulatorSettings(seed=3)
    messages = user("same")
    assert predict_outcome(settings, messages) == predict_outcome(
        dataclasses.replace(settings, speedup=9), messages
    )
    assert predict_outcome(settings, messages) != predict_outcome(
        dataclasses.replace(settings, seed=4), messages
    )
    assert predict_outcome(settings, messages) != predict_outcome(settings, user("other"))


def test_a_prompt_counts_one_token_per_word_plus_the_template() -> None:
    one = count_prompt_tokens(user("one two three"))
    assert count_prompt_tokens(user("one two three four")) == one + 1
    parts = [{"role": "user", "content": [{"type": "text", "text": "one two three"}]}]
    assert count_prompt_tokens(parts) == one


def test_the_predicted_budget_cases_are_consistent() -> None:
    settings = SimulatorSettings()
    messages = user("budget cases")
    full = predict_outcome(settings, messages)
    in_thinking = predict_outcome(settings, messages, full.thinking_tokens - 1)
    in_answer = predict_outcome(settings, messages, full.thinking_tokens + 2)
    assert (in_thinking.finish_reason, in_thinking.content_empty) == ("length", True)
    assert in_thinking.reasoning_tokens == in_thinking.completion_tokens
    assert (in_answer.finish_reason, in_answer.content_empty) == ("length", False)
    assert in_answer.reasoning_tokens == full.thinking_tokens
    too_long = predict_outcome(dataclasses.replace(settings, context_length=8), messages)
    assert too_long.context_error is not None


def test_settings_round_trip_through_the_command_line() -> None:
    settings = SimulatorSettings(
        port=31234,
        speedup=250.0,
        api_key="k",
        max_queued_requests=5,
        enable_metrics=True,
        error_rate=0.25,
        crash_after_requests=3,
    )
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    assert settings_from_args(parser.parse_args(settings_to_argv(settings))) == settings


@pytest.mark.parametrize(
    "bad",
    [
        {"speedup": 0},
        {"accept_length": 5.0},
        {"error_rate": 0.7, "hang_rate": 0.7},
        {"error_status": 404},
        {"served_model_name": "a:b"},
    ],
)
def test_impossible_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must"):
        SimulatorSettings(**bad)  # type: ignore[arg-type]


def test_the_throughput_model_is_calibrated_to_the_reference() -> None:
    settings = SimulatorSettings()
    assert 2250 <= settings.capacity_output_tokens_per_s() <= 2350
    single = settings.accept_length / settings.decode_step_s(1)
    assert 165 <= single <= 175


def test_the_cli_refuses_bad_options_with_exit_code_2() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "inference.simulator", "--speedup", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert completed.returncode == 2 and "--speedup must be positive" in completed.stderr


def test_the_dispatcher_knows_the_simulate_command() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "inference", "simulate", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert completed.returncode == 0 and "--max-running-requests" in completed.stdout
