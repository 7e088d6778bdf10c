"""The rules: outcomes, settings and server facts in, findings out; findings in, a verdict out. Pure."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from core.records import Quality, SamplingSettings
from inference.quality import FINISH_LENGTH
from inference.sglang_defaults import BUDGET_GROWTH_FACTOR
from node.preflight.outcomes import PromptOutcome, ServerReading, Totals

FAIL_SHARE = 0.5
"""At least this share of answers unusable for one reason fails the preflight; any smaller share warns."""
LOW_ACCEPT_LENGTH_TOKENS = 2.0
"""Below this many tokens per verify pass, speculative decoding barely pays for its draft steps."""
BUDGET_GRANULARITY_TOKENS = 1024
DEFAULT_MAX_TOKENS = SamplingSettings().max_tokens
HTTP_UNAUTHORIZED = 401
HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
MAX_ERRORS_QUOTED = 3


class Level(enum.StrEnum):
    """How much a finding matters: a NOTE never changes the verdict."""

    NOTE = "NOTE"
    WARN = "WARN"
    FAIL = "FAIL"


class Verdict(enum.StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Finding:
    level: Level
    problem: str
    advice: str


def suggest_max_tokens(max_tokens: int, *, every_output_cut: bool = False) -> int:
    """Twice the budget, rounded up to a multiple of 1024 tokens; at least the default budget when every
    output was cut.

    A cut output's real length is unknown (only that it exceeds the budget), and no output, cut or
    not, is longer than the budget, so "twice the longest thinking seen" is never more than twice the
    budget. When every output was cut nothing is known about the real lengths, and doubling a small
    budget step by step takes several preflights: the default (32,768 tokens, which the reference
    workload's thinking traces fit) is then the floor.
    """
    wanted = BUDGET_GROWTH_FACTOR * max_tokens
    if every_output_cut:
        wanted = max(wanted, DEFAULT_MAX_TOKENS)
    return math.ceil(wanted / BUDGET_GRANULARITY_TOKENS) * BUDGET_GRANULARITY_TOKENS


def _count(part: int, whole: int) -> str:
    return f"{part} of {whole}"


def _share_level(part: int, whole: int) -> Level:
    return Level.FAIL if part >= FAIL_SHARE * whole else Level.WARN


def request_error_findings(outcomes: Sequence[PromptOutcome], url: str) -> list[Finding]:
    """Requests the server refused (4xx: FAIL) or never answered (FAIL if none answered, else WARN)."""
    failed = [outcome for outcome in outcomes if not outcome.answered]
    if not failed:
        return []
    total = len(outcomes)
    findings: list[Finding] = []
    rejected = [outcome for outcome in failed if outcome.rejected]
    if rejected:
        status = rejected[0].error_status
        findings.append(
            Finding(
                Level.FAIL,
                f"the server refused {_count(len(rejected), total)} requests: {_quoted_errors(rejected)}",
                _rejection_advice(status, url),
            )
        )
    unanswered = [outcome for outcome in failed if not outcome.rejected]
    if unanswered:
        nothing_answered = not any(outcome.answered for outcome in outcomes)
        unreachable = all(outcome.error_status is None for outcome in unanswered)
        findings.append(
            Finding(
                Level.FAIL if nothing_answered else Level.WARN,
                f"{_count(len(unanswered), total)} requests got no completion: {_quoted_errors(unanswered)}",
                (
                    f"check that the server is up and reachable: `python -m node wait --url {url}`; "
                    "SGLang binds 127.0.0.1 unless started with --host 0.0.0.0, and refuses connections "
                    "while it loads weights; a timeout means --timeout is shorter than a long completion"
                )
                if unreachable
                else "the run retries these, but read the server's log: errors here usually recur in the run",
            )
        )
    return findings


def _quoted_errors(outcomes: Sequence[PromptOutcome]) -> str:
    distinct = list(dict.fromkeys(str(outcome.error) for outcome in outcomes))
    quoted = "; ".join(distinct[:MAX_ERRORS_QUOTED])
    more = len(distinct) - MAX_ERRORS_QUOTED
    return quoted + (f" (and {more} more)" if more > 0 else "")


def _rejection_advice(status: int | None, url: str) -> str:
    if status in (HTTP_UNAUTHORIZED, HTTP_FORBIDDEN):
        return (
            "the API key is missing or wrong: export DRAFTGEN_API_KEY (or --api-key-env/--api-key-file) "
            "with the key the server was started with (--api-key)"
        )
    if status == HTTP_NOT_FOUND:
        return f"is {url} an SGLang server? Give --url as http://host:port, without /v1"
    return (
        "the server's message names what it refuses (e.g. max_tokens over the context length, or a "
        "sampling value out of range): change that setting here and in the run"
    )


def answer_findings(
    outcomes: Sequence[PromptOutcome], sampling: SamplingSettings, server: ServerReading
) -> list[Finding]:
    """The shape of the answers: think tags in the answer, truncation, empty answers, missing or
    unexpected reasoning."""
    done = [outcome for outcome in outcomes if outcome.answered]
    if not done:
        return []
    findings = _think_tag_findings(done, server)
    findings += _truncation_findings(done, sampling, server)
    findings += _empty_answer_findings(done)
    if sampling.enable_thinking:
        if not any(outcome.think_tags_in_answer for outcome in done):  # the parser, not thinking, is off
            findings += _missing_reasoning_findings(done, server)
    else:
        findings += _unexpected_reasoning_findings(done)
    return findings


def _think_tag_findings(done: Sequence[PromptOutcome], server: ServerReading) -> list[Finding]:
    tagged = [outcome for outcome in done if outcome.think_tags_in_answer]
    if not tagged:
        return []
    parser = (
        "the server runs without --reasoning-parser"
        if server.reasoning_parser in (None, "none") and server.error is None
        else f"the server's --reasoning-parser is {server.reasoning_parser or 'unknown'}"
    )
    return [
        Finding(
            Level.FAIL,
            f"{_count(len(tagged), len(done))} answers contain <think> tags: "
            "the thinking is mixed into the answer instead of reasoning_content",
            f"{parser}: start SGLang with --reasoning-parser qwen3 (what `python -m node serve` "
            "passes) or the parser matching the model's chat template",
        )
    ]


def _truncation_findings(
    done: Sequence[PromptOutcome], sampling: SamplingSettings, server: ServerReading
) -> list[Finding]:
    cut = [outcome for outcome in done if outcome.finish_reason == FINISH_LENGTH]
    if not cut:
        return []
    in_thinking = sum(1 for outcome in cut if outcome.quality is Quality.TRUNCATED_IN_THINKING)
    budget = suggest_max_tokens(sampling.max_tokens, every_output_cut=len(cut) == len(done))
    advice = (
        f"raise --max-tokens from {sampling.max_tokens} to {budget}, here and in `python -m producer enqueue`"
    )
    if server.context_length_tokens is not None and budget >= server.context_length_tokens:
        advice += (
            f"; the server's context length is {server.context_length_tokens} tokens, so restart it "
            "with a --context-length of at least the budget plus the longest prompt"
        )
    if len(cut) == len(done):
        advice += "; every output was cut, so the real lengths are unknown: run preflight again with it"
    if in_thinking == len(done):
        return [
            Finding(
                Level.FAIL,
                f"every answer is empty: all {len(done)} outputs hit max_tokens={sampling.max_tokens} "
                "inside thinking (finish 'length', content '')",
                advice,
            )
        ]
    level = _share_level(len(cut), len(done))
    if level is Level.WARN:
        advice += "; or keep it and choose what the run does with them: --truncated-thinking keep|drop|retry"
    detail = f" ({in_thinking} inside thinking, with an empty answer)" if in_thinking else ""
    return [
        Finding(
            level,
            f"{_count(len(cut), len(done))} outputs hit max_tokens={sampling.max_tokens}{detail}",
            advice,
        )
    ]


def _empty_answer_findings(done: Sequence[PromptOutcome]) -> list[Finding]:
    """Answers that ended (not cut) with nothing in `content`: the model stopped inside its thinking."""
    empty = [outcome for outcome in done if outcome.quality is Quality.EMPTY_ANSWER]
    if not empty:
        return []
    in_thinking = sum(1 for outcome in empty if outcome.has_reasoning)
    where = f", {in_thinking} of them inside thinking" if in_thinking else ""
    return [
        Finding(
            _share_level(len(empty), len(done)),
            f"{_count(len(empty), len(done))} outputs ended (finish '{empty[0].finish_reason}') "
            f"with an empty answer{where}",
            "a larger budget will not help: the model ended its turn before answering. Check the "
            "chat template and any stop strings; a model that often stops inside </think> is not "
            "suited to this run, and the run's quality gate pauses on too many empty answers",
        )
    ]


def _missing_reasoning_findings(done: Sequence[PromptOutcome], server: ServerReading) -> list[Finding]:
    bare = [outcome for outcome in done if outcome.quality is Quality.NO_REASONING]
    if not bare:
        return []
    parser = f" (the server reports --reasoning-parser {server.reasoning_parser or 'none'})"
    level = _share_level(len(bare), len(done))
    if level is Level.FAIL:
        return [
            Finding(
                level,
                f"thinking seems off: {_count(len(bare), len(done))} answers came without any reasoning "
                "although thinking is on",
                "check chat_template_kwargs.enable_thinking (preflight sends true; the server may "
                "override it with --default-chat-template-kwargs), the model's chat template (does it "
                f"think at all?) and --reasoning-parser{parser}",
            )
        ]
    return [
        Finding(
            level,
            f"{_count(len(bare), len(done))} answers came without reasoning (an empty think block)",
            "a few are normal for easy prompts; if the run shows many, thinking is off for them",
        )
    ]


def _unexpected_reasoning_findings(done: Sequence[PromptOutcome]) -> list[Finding]:
    thinking = [outcome for outcome in done if outcome.has_reasoning or outcome.reasoning_tokens > 0]
    if not thinking:
        return []
    return [
        Finding(
            Level.WARN,
            f"thinking is off in these settings, but {_count(len(thinking), len(done))} outputs carry "
            "reasoning",
            "the chat template thinks regardless of enable_thinking=false (a '-Thinking' model, or "
            "--reasoning-parser qwen3-thinking); pass --thinking if thinking traces are wanted, "
            "otherwise serve a model whose template honours enable_thinking",
        )
    ]


def speculative_findings(totals: Totals, server: ServerReading) -> list[Finding]:
    """Speculative decoding's accept length: per response (sglext) first, else the server's average."""
    if totals.answered == 0:
        return []
    accept = totals.accept_length_tokens or server.avg_spec_accept_length
    if accept is None:
        if server.speculative_algorithm is not None:
            return []  # configured, but no step reported yet: nothing to judge
        return [
            Finding(
                Level.NOTE,
                "no speculative-decoding statistics: the server seems to run without speculative decoding",
                "the reference setup runs the model's MTP heads (NEXTN, about 3.5 tokens per step), "
                "which `python -m node serve` enables by default",
            )
        ]
    if accept < LOW_ACCEPT_LENGTH_TOKENS:
        return [
            Finding(
                Level.WARN,
                f"speculative decoding accepts only {accept:.2f} tokens per step "
                f"(below {LOW_ACCEPT_LENGTH_TOKENS:.0f})",
                "the draft barely matches the model: check that --speculative-draft-model-path (if set) "
                "holds this model's MTP heads and the speculative steps/draft tokens; compare the "
                "throughput with `serve --no-speculative`",
            )
        ]
    return []


def model_name_findings(sampling: SamplingSettings, server: ServerReading) -> list[Finding]:
    served = server.served_model_name
    if served is None or sampling.model == served:
        return []
    return [
        Finding(
            Level.NOTE,
            f"the settings send model '{sampling.model}' but the server serves '{served}'",
            f"SGLang does not check the name, but every completion records it: pass --model {served}",
        )
    ]


def judge(
    outcomes: Sequence[PromptOutcome],
    sampling: SamplingSettings,
    server: ServerReading,
    totals: Totals,
    url: str,
) -> list[Finding]:
    """Every finding, worst first."""
    findings = (
        request_error_findings(outcomes, url)
        + answer_findings(outcomes, sampling, server)
        + speculative_findings(totals, server)
        + model_name_findings(sampling, server)
    )
    severity = {Level.FAIL: 0, Level.WARN: 1, Level.NOTE: 2}
    return sorted(findings, key=lambda finding: severity[finding.level])


def verdict_of(findings: Sequence[Finding]) -> Verdict:
    levels = {finding.level for finding in findings}
    if Level.FAIL in levels:
        return Verdict.FAIL
    if Level.WARN in levels:
        return Verdict.WARN
    return Verdict.PASS
