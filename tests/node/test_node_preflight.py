"""Preflight: a few real completions with a run's settings, judged into PASS, WARN or FAIL with advice.

The rules are checked on hand-made outcomes; the command end to end against the simulator over HTTP.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from core.records import SamplingSettings
from inference.errors import InferenceRejected, InferenceUnavailable
from inference.simulator import SimulatorProcess, SimulatorSettings
from node.cli import build_parser, main
from node.errors import OptionError
from node.preflight.judging import Finding, Level, Verdict, judge, suggest_max_tokens, verdict_of
from node.preflight.outcomes import (
    PromptOutcome,
    ServerReading,
    answered,
    outcome_of_error,
    server_reading,
    summarize,
)
from node.preflight.report import build_report
from node.preflight_cli import sampling_from_args

URL = "http://gpu-0:30000"
BUDGET = 4096
THINKING = SamplingSettings(max_tokens=BUDGET, enable_thinking=True)
NO_THINKING = SamplingSettings(max_tokens=BUDGET, enable_thinking=False)
SPECULATIVE_SERVER = ServerReading(
    served_model_name="default", reasoning_parser="qwen3", speculative_algorithm="NEXTN"
)
WALL_S = 2.0
SPEEDUP = 200.0
GENEROUS_BUDGET = 32768
SERVER_WINDOW_ACCEPT_SLACK = 0.2
TINY_BUDGET = 64
"""Far below the simulator's thinking lengths (mean 1,900 tokens): every output is cut inside thinking."""


# ---------------------------------------------------------------- hand-made outcomes


def good(
    name: str = "p", *, reasoning: int = 1500, answer: int = 400, accept: float | None = 3.5
) -> PromptOutcome:
    return answered(
        name,
        content="\n\nThe answer.",
        reasoning_content="\nLet me think.\n",
        finish_reason="stop",
        completion_tokens=reasoning + answer,
        reasoning_tokens=reasoning,
        thinking_enabled=True,
        spec_accept_length=accept,
    )


def cut_in_thinking(name: str = "cut", budget: int = BUDGET) -> PromptOutcome:
    return answered(
        name,
        content="",
        reasoning_content="\nstill thinking",
        finish_reason="length",
        completion_tokens=budget,
        reasoning_tokens=budget,
        thinking_enabled=True,
        spec_accept_length=3.5,
    )


def stopped_in_thinking(name: str = "stopped") -> PromptOutcome:
    return answered(
        name,
        content="",
        reasoning_content="\nthinking, then EOS",
        finish_reason="stop",
        completion_tokens=900,
        reasoning_tokens=900,
        thinking_enabled=True,
        spec_accept_length=3.5,
    )


def bare_answer(name: str = "bare", *, thinking_enabled: bool = True) -> PromptOutcome:
    return answered(
        name,
        content="OK.",
        reasoning_content=None,
        finish_reason="stop",
        completion_tokens=3,
        reasoning_tokens=0,
        thinking_enabled=thinking_enabled,
        spec_accept_length=3.5,
    )


def findings_for(
    outcomes: list[PromptOutcome],
    sampling: SamplingSettings = THINKING,
    server: ServerReading = SPECULATIVE_SERVER,
) -> list[Finding]:
    return judge(outcomes, sampling, server, summarize(outcomes, WALL_S), URL)


def only(findings: list[Finding], level: Level) -> Finding:
    [finding] = [finding for finding in findings if finding.level is level]
    return finding


def test_healthy_thinking_completions_pass_without_findings() -> None:
    findings = findings_for([good(f"p{i}") for i in range(8)])

    assert findings == []
    assert verdict_of(findings) is Verdict.PASS


def test_every_output_cut_inside_thinking_fails_and_advises_the_default_budget() -> None:
    findings = findings_for(
        [cut_in_thinking(f"p{i}", budget=512) for i in range(8)],
        msgspec.structs.replace(THINKING, max_tokens=512),
    )

    failure = only(findings, Level.FAIL)
    assert "every answer is empty" in failure.problem
    assert "max_tokens=512 inside thinking" in failure.problem
    assert "raise --max-tokens from 512 to 32768" in failure.advice
    assert "run preflight again" in failure.advice
    assert verdict_of(findings) is Verdict.FAIL


def test_the_advised_budget_is_twice_the_current_one_rounded_up_to_a_multiple_of_1024() -> None:
    assert suggest_max_tokens(64) == 1024
    assert suggest_max_tokens(3000) == 6144
    assert suggest_max_tokens(32768) == 65536


def test_when_every_output_was_cut_the_advised_budget_is_at_least_the_default() -> None:
    assert suggest_max_tokens(512, every_output_cut=True) == 32768
    assert suggest_max_tokens(20000, every_output_cut=True) == 40960


def test_a_budget_past_the_servers_context_length_says_to_raise_the_context_too() -> None:
    server = dataclasses.replace(SPECULATIVE_SERVER, context_length_tokens=6000)

    findings = findings_for([cut_in_thinking(f"p{i}") for i in range(8)], server=server)

    assert "the server's context length is 6000 tokens" in only(findings, Level.FAIL).advice


def test_a_few_truncations_warn_with_the_budget_and_the_run_truncation_policy() -> None:
    findings = findings_for([cut_in_thinking(), *(good(f"p{i}") for i in range(7))])

    warning = only(findings, Level.WARN)
    assert warning.problem.startswith("1 of 8 outputs hit max_tokens=4096 (1 inside thinking")
    assert "raise --max-tokens from 4096 to 8192" in warning.advice
    assert "--truncated-thinking" in warning.advice
    assert verdict_of(findings) is Verdict.WARN


def test_half_the_outputs_truncated_fails() -> None:
    findings = findings_for(
        [*(cut_in_thinking(f"c{i}") for i in range(4)), *(good(f"p{i}") for i in range(4))]
    )

    assert "4 of 8 outputs hit max_tokens=4096" in only(findings, Level.FAIL).problem


def test_answers_without_reasoning_while_thinking_is_on_fail_as_thinking_off() -> None:
    findings = findings_for([bare_answer(f"p{i}") for i in range(8)])

    failure = only(findings, Level.FAIL)
    assert failure.problem.startswith("thinking seems off: 8 of 8 answers came without any reasoning")
    assert "chat_template_kwargs.enable_thinking" in failure.advice
    assert "--reasoning-parser" in failure.advice


def test_one_answer_without_reasoning_only_warns() -> None:
    findings = findings_for([bare_answer(), *(good(f"p{i}") for i in range(7))])

    assert "1 of 8 answers came without reasoning" in only(findings, Level.WARN).problem


def test_think_tags_in_the_answer_fail_as_a_missing_reasoning_parser_not_as_thinking_off() -> None:
    raw = answered(
        "raw",
        content="Let me think.\n</think>\n\nThe answer.",
        reasoning_content=None,
        finish_reason="stop",
        completion_tokens=900,
        reasoning_tokens=0,
        thinking_enabled=True,
    )
    server = dataclasses.replace(SPECULATIVE_SERVER, reasoning_parser=None)

    findings = findings_for([raw] * 8, server=server)

    failure = only(findings, Level.FAIL)
    assert "8 of 8 answers contain <think> tags" in failure.problem
    assert "the server runs without --reasoning-parser" in failure.advice
    assert "--reasoning-parser qwen3" in failure.advice
    assert not any("thinking seems off" in finding.problem for finding in findings)


def test_a_model_stopping_inside_thinking_warns_at_a_low_share_and_fails_at_half() -> None:
    few = findings_for([stopped_in_thinking(), *(good(f"p{i}") for i in range(7))])
    many = findings_for(
        [*(stopped_in_thinking(f"s{i}") for i in range(4)), *(good(f"p{i}") for i in range(4))]
    )

    warning = only(few, Level.WARN)
    assert (
        "1 of 8 outputs ended (finish 'stop') with an empty answer, 1 of them inside thinking"
        in warning.problem
    )
    assert "a larger budget will not help" in warning.advice
    assert "4 of 8 outputs ended" in only(many, Level.FAIL).problem


def test_thinking_off_expects_no_reasoning_and_passes() -> None:
    findings = findings_for([bare_answer(f"p{i}", thinking_enabled=False) for i in range(8)], NO_THINKING)

    assert findings == []


def test_thinking_off_but_reasoning_returned_warns_that_the_template_forces_thinking() -> None:
    thinking_anyway = answered(
        "p",
        content="\n\nThe answer.",
        reasoning_content="\nthinking\n",
        finish_reason="stop",
        completion_tokens=1900,
        reasoning_tokens=1500,
        thinking_enabled=False,
    )

    findings = findings_for([thinking_anyway] * 8, NO_THINKING)

    warning = only(findings, Level.WARN)
    assert "thinking is off in these settings, but 8 of 8 outputs carry reasoning" in warning.problem
    assert "--thinking" in warning.advice


def test_a_low_accept_length_in_the_responses_warns() -> None:
    findings = findings_for([good(f"p{i}", accept=1.4) for i in range(8)])

    assert "accepts only 1.40 tokens per step" in only(findings, Level.WARN).problem


def test_the_servers_average_accept_length_is_judged_when_responses_carry_none() -> None:
    server = dataclasses.replace(SPECULATIVE_SERVER, avg_spec_accept_length=1.2)

    findings = findings_for([good(f"p{i}", accept=None) for i in range(8)], server=server)

    assert "accepts only 1.20 tokens per step" in only(findings, Level.WARN).problem


def test_no_speculative_statistics_at_all_is_only_a_note() -> None:
    server = ServerReading(served_model_name="default", reasoning_parser="qwen3")

    findings = findings_for([good(f"p{i}", accept=None) for i in range(8)], server=server)

    assert "without speculative decoding" in only(findings, Level.NOTE).problem
    assert verdict_of(findings) is Verdict.PASS


def test_the_response_accept_length_is_weighted_by_tokens() -> None:
    outcomes = [
        good("long", reasoning=3000, answer=0, accept=3.0),
        good("short", reasoning=100, answer=0, accept=1.0),
    ]

    totals = summarize(outcomes, WALL_S)

    assert totals.accept_length_tokens == pytest.approx(3100 / (1000 + 100))
    assert totals.output_tokens_per_s == pytest.approx(3100 / WALL_S)


def test_an_unreachable_server_fails_with_the_clients_message_and_how_to_check() -> None:
    unreachable = InferenceUnavailable("no answer from http://gpu-0:30000: ConnectError('refused')")

    findings = findings_for([outcome_of_error(f"p{i}", unreachable) for i in range(8)])

    failure = only(findings, Level.FAIL)
    assert "8 of 8 requests got no completion: no answer from http://gpu-0:30000" in failure.problem
    assert "python -m node wait --url http://gpu-0:30000" in failure.advice


def test_a_refused_request_fails_with_the_servers_message() -> None:
    too_long = InferenceRejected("HTTP 400: max_completion_tokens is too large: 300000.", status=400)
    unauthorized = InferenceRejected("HTTP 401: Unauthorized", status=401)

    budget = only(findings_for([outcome_of_error("p", too_long), good()]), Level.FAIL)
    key = only(findings_for([outcome_of_error("p", unauthorized)]), Level.FAIL)

    assert "refused 1 of 2 requests: HTTP 400: max_completion_tokens is too large" in budget.problem
    assert "DRAFTGEN_API_KEY" in key.advice


def test_server_errors_beside_good_answers_only_warn() -> None:
    overloaded = InferenceUnavailable("HTTP 503: The request queue is full.", status=503)

    findings = findings_for([outcome_of_error("p", overloaded), *(good(f"p{i}") for i in range(7))])

    assert "1 of 8 requests got no completion: HTTP 503" in only(findings, Level.WARN).problem


def test_a_model_name_other_than_the_served_one_is_a_note() -> None:
    server = dataclasses.replace(SPECULATIVE_SERVER, served_model_name="Qwen3.6-27B")

    findings = findings_for([good(f"p{i}") for i in range(8)], server=server)

    assert "pass --model Qwen3.6-27B" in only(findings, Level.NOTE).advice


def test_server_info_gives_the_accept_length_only_once_a_speculative_step_ran() -> None:
    payload: dict[str, Any] = {
        "served_model_name": "Qwen3.6-27B",
        "reasoning_parser": "qwen3",
        "speculative_algorithm": "NEXTN",
        "context_length": 40960,
        "internal_states": [{"avg_spec_accept_length": 3.4}],
    }

    facts = server_reading(payload)
    idle = server_reading({**payload, "internal_states": [{"avg_spec_accept_length": 0.0}]})

    assert (facts.avg_spec_accept_length, facts.context_length_tokens, facts.reasoning_parser) == (
        3.4,
        40960,
        "qwen3",
    )
    assert idle.avg_spec_accept_length is None


def test_findings_are_listed_worst_first() -> None:
    report = build_report(
        URL,
        THINKING,
        [
            outcome_of_error("p", InferenceUnavailable("HTTP 503: The request queue is full.", status=503)),
            *(cut_in_thinking(f"c{i}") for i in range(4)),
            *(good(f"q{i}") for i in range(3)),
        ],
        dataclasses.replace(SPECULATIVE_SERVER, served_model_name="other"),
        WALL_S,
    )

    assert [finding.level for finding in report.findings] == [Level.FAIL, Level.WARN, Level.NOTE]
    assert report.verdict is Verdict.FAIL


# ---------------------------------------------------------------- settings from the command line


def test_the_run_toml_is_read_like_enqueue_reads_it_and_options_override_it(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(
        'batch_size = 16\n[sampling]\nmodel = "Qwen3.6-27B"\nmax_tokens = 8192\ntemperature = 0.7\n'
    )
    args = _parse(["--config", str(config), "--max-tokens", "16384"])

    sampling = sampling_from_args(args)

    assert (sampling.model, sampling.max_tokens, sampling.temperature) == ("Qwen3.6-27B", 16384, 0.7)


def test_a_value_sglang_would_refuse_is_a_usage_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exit_code = main(["preflight", "--url", URL, "--temperature", "nan"])

    assert exit_code == EXIT_USAGE
    assert "--temperature nan: must be a finite number" in capsys.readouterr().err


def test_a_zero_budget_is_a_usage_error() -> None:
    with pytest.raises(OptionError, match="--max-tokens 0: must be between 1 and"):
        sampling_from_args(_parse(["--max-tokens", "0"]))


def _parse(options: list[str]) -> Any:
    return build_parser().parse_args(["preflight", "--url", URL, *options])


# ---------------------------------------------------------------- end to end against the simulator


@pytest.fixture(scope="module")
def simulator() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(SimulatorSettings(speedup=SPEEDUP)) as sim:
        yield sim


def preflight_json(url: str, capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, dict[str, Any]]:
    exit_code = main(["preflight", "--url", url, "--json", *options])
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return exit_code, report


def test_a_healthy_simulator_with_a_generous_budget_passes(
    simulator: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    exit_code, report = preflight_json(
        simulator.url, capsys, "--max-tokens", str(GENEROUS_BUDGET), "--model", "Qwen/Qwen3.6-27B"
    )

    assert (exit_code, report["verdict"]) == (EXIT_OK, "PASS")
    assert report["findings"] == []
    totals = report["totals"]
    assert (totals["prompts"], totals["answered"], totals["qualities"]) == (8, 8, {"ok": 8})
    assert totals["reasoning_tokens"] > 0
    assert totals["output_tokens_per_s"] > 0
    assert totals["accept_length_tokens"] == pytest.approx(3.5, abs=0.05)
    # The server's figure is its last decode window's: a window of finishing requests, capped at their
    # budget, verifies for fewer tokens, so it strays further from the mean than the requests' own.
    assert report["server"]["avg_spec_accept_length"] == pytest.approx(3.5, abs=SERVER_WINDOW_ACCEPT_SLACK)
    assert all(prompt["answer_chars"] > 0 and prompt["reasoning_chars"] > 0 for prompt in report["prompts"])


def test_a_simulator_whose_outputs_all_hit_the_budget_fails_with_the_budget_advice(
    simulator: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    exit_code, report = preflight_json(simulator.url, capsys, "--max-tokens", str(TINY_BUDGET))

    assert (exit_code, report["verdict"]) == (EXIT_FAILED, "FAIL")
    assert report["totals"]["finish_reasons"] == {"length": 8}
    [failure] = [finding for finding in report["findings"] if finding["level"] == "FAIL"]
    assert failure["problem"].startswith(
        "every answer is empty: all 8 outputs hit max_tokens=64 inside thinking"
    )
    assert "raise --max-tokens from 64 to 32768" in failure["advice"]


def test_thinking_off_reports_no_reasoning_and_expects_none(
    simulator: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    exit_code, report = preflight_json(
        simulator.url,
        capsys,
        "--no-thinking",
        "--max-tokens",
        str(GENEROUS_BUDGET),
        "--model",
        "Qwen/Qwen3.6-27B",
    )

    assert (exit_code, report["verdict"]) == (EXIT_OK, "PASS")
    assert report["sampling"]["enable_thinking"] is False
    assert report["totals"]["reasoning_tokens"] == 0
    assert all(prompt["reasoning_chars"] == 0 and prompt["answer_chars"] > 0 for prompt in report["prompts"])


def test_prompts_come_from_a_jsonl_file_skipping_bad_rows(
    simulator: SimulatorProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": "Add 2 and 3."},
        {"nothing": "here"},
        {"prompt": "Name a prime."},
        {"prompt": "Unused."},
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))

    exit_code, report = preflight_json(simulator.url, capsys, "--prompts", str(data), "--count", "2")

    assert exit_code == EXIT_OK
    assert [prompt["name"] for prompt in report["prompts"]] == ["row 1", "row 3"]


def test_prompts_in_a_chat_shape_of_their_own_are_read_with_the_run_s_mapping_from_options_or_toml(
    simulator: SimulatorProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tmp_path / "dialogs.jsonl"
    dialog = [{"speaker": "human", "text": "Hi"}, {"speaker": "bot", "text": "Hello"}]
    rows = [
        {"conv_id": f"c{i}", "dialog": [*dialog, {"speaker": "human", "text": f"Add {i} and 3."}]}
        for i in range(2)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "run.toml"
    config.write_text(
        'messages_field = "dialog"\nturn_keys = ["speaker", "text"]\n'
        '[roles]\nhuman = "user"\nbot = "assistant"\n'
    )
    mapping = (
        "--messages-field",
        "dialog",
        "--turn-keys",
        "speaker,text",
        "--roles",
        "human=user,bot=assistant",
    )

    by_options = preflight_json(simulator.url, capsys, "--prompts", str(data), "--count", "2", *mapping)
    by_toml = preflight_json(
        simulator.url, capsys, "--prompts", str(data), "--count", "2", "--config", str(config)
    )

    for exit_code, report in (by_options, by_toml):
        assert exit_code == EXIT_OK
        assert [prompt["name"] for prompt in report["prompts"]] == ["row 1", "row 2"]


def test_prompts_whose_shape_the_run_does_not_map_are_skipped_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "dialogs.jsonl"
    data.write_text(json.dumps({"dialog": [{"speaker": "human", "text": "Hi"}]}) + "\n")

    exit_code = main(["preflight", "--url", URL, "--prompts", str(data), "--messages-field", "dialog"])

    assert exit_code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "dialog[0].role: is missing (a turn is {role, content} or ShareGPT {from, value}" in err
    assert "holds no usable prompt" in err


def test_the_readable_report_shows_each_prompt_the_finding_its_advice_and_the_verdict(
    simulator: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    exit_code = main(["preflight", "--url", simulator.url, "--max-tokens", str(TINY_BUDGET), "--count", "3"])

    out = capsys.readouterr().out
    assert exit_code == EXIT_FAILED
    assert "math: divisors" in out and "truncated_in_thinking" in out
    assert "FAIL every answer is empty" in out
    assert "raise --max-tokens from 64 to 32768" in out
    assert "Verdict:  FAIL" in out


def test_a_server_without_a_reasoning_parser_fails_on_think_tags(capsys: pytest.CaptureFixture[str]) -> None:
    with SimulatorProcess(SimulatorSettings(speedup=SPEEDUP, reasoning_parser="none")) as sim:
        exit_code, report = preflight_json(sim.url, capsys, "--count", "3")

    assert exit_code == EXIT_FAILED
    assert "answers contain <think> tags" in report["findings"][0]["problem"]


def test_a_server_with_an_api_key_fails_without_it_and_passes_with_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DRAFTGEN_API_KEY", raising=False)
    with SimulatorProcess(SimulatorSettings(speedup=SPEEDUP, api_key="s3cret")) as sim:
        refused_exit, refused = preflight_json(sim.url, capsys, "--count", "2")
        monkeypatch.setenv("DRAFTGEN_API_KEY", "s3cret")
        allowed_exit, allowed = preflight_json(sim.url, capsys, "--count", "2", "--model", "Qwen/Qwen3.6-27B")

    assert (refused_exit, refused["verdict"]) == (EXIT_FAILED, "FAIL")
    assert "refused 2 of 2 requests: HTTP 401" in refused["findings"][0]["problem"]
    assert (allowed_exit, allowed["verdict"]) == (EXIT_OK, "PASS")


def test_an_unreachable_server_fails(unused_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    exit_code, report = preflight_json(unused_url, capsys, "--count", "2")

    assert (exit_code, report["verdict"]) == (EXIT_FAILED, "FAIL")
    assert "2 of 2 requests got no completion" in report["findings"][0]["problem"]


def test_an_unreadable_prompts_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exit_code = main(["preflight", "--url", URL, "--prompts", str(tmp_path / "missing.jsonl")])

    assert exit_code == EXIT_USAGE
    assert "--prompts" in capsys.readouterr().err
