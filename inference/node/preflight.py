"""Preflight: send a handful of real prompts with a run's settings, then judge whether the data is usable.

Every way the data went bad in practice looked healthy from the outside: thinking off (87% of the
answers empty), a `max_tokens` so small that the whole budget went to thinking (`content == ""`,
finish `length`, nothing failed), a server without a reasoning parser (`<think>` in the answer).
A few completions show each of these in seconds, so preflight sends them before a run starts.

The judging is pure: `judge` turns the outcomes, the settings and what `/server_info` said into
findings, and `verdict_of` turns findings into PASS, WARN or FAIL. Only `run_preflight` and
`fetch_server_info` do I/O.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.client import DEFAULT_REQUEST_TIMEOUT_S, ChatResult, ClientSettings, SGLangClient
from inference.errors import InferenceError, InferenceRejected, InferenceUnavailable
from inference.quality import FINISH_LENGTH, label_completion
from inference.records import Message, Quality, SamplingSettings
from inference.server_probe import ServerProbe

DEFAULT_PROMPT_COUNT = 8
FAIL_SHARE = 0.5
"""At least this share of answers unusable for one reason fails the preflight; any smaller share warns."""
LOW_ACCEPT_LENGTH_TOKENS = 2.0
"""Below this many tokens per verify pass, speculative decoding barely pays for its draft steps."""
BUDGET_GROWTH_FACTOR = 2
BUDGET_GRANULARITY_TOKENS = 1024
DEFAULT_MAX_TOKENS = SamplingSettings().max_tokens
SERVER_INFO_TIMEOUT_S = 10.0
THINK_TAGS = ("<think>", "</think>")
HTTP_UNAUTHORIZED = 401
HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
MAX_ERRORS_QUOTED = 3
RID_PREFIX = "preflight"


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
class PreflightPrompt:
    name: str
    messages: list[Message]


def _user(text: str) -> Message:
    return Message(role="user", content=text)


BUILTIN_PROMPTS: tuple[PreflightPrompt, ...] = (
    PreflightPrompt(
        "math: divisors",
        [_user("What is the sum of all positive divisors of 360? Explain how you got it.")],
    ),
    PreflightPrompt(
        "math: word problem",
        [
            _user(
                "A train leaves at 9:40 and travels 212 km at 80 km/h, then 95 km at 60 km/h. "
                "At what time does it arrive?"
            )
        ],
    ),
    PreflightPrompt(
        "code: function",
        [
            _user(
                "Write a Python function that returns the n-th Fibonacci number in O(log n) time, "
                "with a short docstring and two doctests."
            )
        ],
    ),
    PreflightPrompt(
        "code: bug",
        [
            _user(
                "This function should remove duplicates from a list while keeping the order, "
                "but it is wrong. Fix it and say why:\n\n"
                "def dedup(items):\n    return list(set(items))"
            )
        ],
    ),
    PreflightPrompt(
        "explain: science",
        [_user("Explain to a twelve-year-old why the sky is blue but sunsets are red.")],
    ),
    PreflightPrompt(
        "explain: systems",
        [_user("Explain how TCP congestion control reacts to packet loss, in a few paragraphs.")],
    ),
    PreflightPrompt(
        "multi-turn: follow-up",
        [
            _user("What is a hash table?"),
            Message(
                role="assistant",
                content="A hash table maps keys to values by hashing each key to a slot in an array.",
            ),
            _user("What happens when two keys hash to the same slot, and how does that affect speed?"),
        ],
    ),
    PreflightPrompt(
        "multi-turn: system",
        [
            Message(role="system", content="You are a concise assistant for a cooking website."),
            _user("I have eggs, spinach and feta. What can I make for lunch?"),
            Message(role="assistant", content="A spinach and feta omelette is quick and filling."),
            _user("How do I keep it from going rubbery?"),
        ],
    ),
)


@dataclass(frozen=True, kw_only=True)
class PromptOutcome:
    """One prompt's completion, or why there is none (`error`)."""

    name: str
    finish_reason: str | None = None
    content: str = ""
    reasoning_content: str | None = None
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    latency_s: float = 0.0
    spec_accept_length: float | None = None
    quality: Quality | None = None
    error: str | None = None
    error_status: int | None = None  # None with an error: no HTTP answer at all
    rejected: bool = False  # the server refused the request (4xx): the same settings are refused again

    @property
    def answered(self) -> bool:
        return self.error is None

    @property
    def has_reasoning(self) -> bool:
        return bool(self.reasoning_content and self.reasoning_content.strip())

    @property
    def think_tags_in_answer(self) -> bool:
        return any(tag in self.content for tag in THINK_TAGS)


def answered(
    name: str,
    *,
    content: str,
    reasoning_content: str | None,
    finish_reason: str,
    completion_tokens: int,
    reasoning_tokens: int,
    thinking_enabled: bool,
    latency_s: float = 0.0,
    spec_accept_length: float | None = None,
) -> PromptOutcome:
    """An answered prompt, labelled the way the run labels its completions."""
    return PromptOutcome(
        name=name,
        finish_reason=finish_reason,
        content=content,
        reasoning_content=reasoning_content,
        completion_tokens=completion_tokens,
        reasoning_tokens=reasoning_tokens,
        latency_s=latency_s,
        spec_accept_length=spec_accept_length,
        quality=label_completion(
            content=content,
            reasoning_content=reasoning_content,
            finish_reason=finish_reason,
            thinking_enabled=thinking_enabled,
        ),
    )


def outcome_of_result(name: str, result: ChatResult, *, thinking_enabled: bool) -> PromptOutcome:
    return answered(
        name,
        content=result.content,
        reasoning_content=result.reasoning_content,
        finish_reason=result.finish_reason,
        completion_tokens=result.usage.completion_tokens,
        reasoning_tokens=result.usage.reasoning_tokens,
        thinking_enabled=thinking_enabled,
        latency_s=result.finished_at - result.started_at,
        spec_accept_length=result.spec_accept_length,
    )


def outcome_of_error(name: str, error: InferenceError) -> PromptOutcome:
    return PromptOutcome(
        name=name,
        error=str(error),
        error_status=getattr(error, "status", None),
        rejected=isinstance(error, InferenceRejected),
    )


@dataclass(frozen=True, kw_only=True)
class ServerFacts:
    """What `/server_info` says about the server; every field None when it could not be read."""

    served_model_name: str | None = None
    reasoning_parser: str | None = None
    speculative_algorithm: str | None = None
    avg_spec_accept_length: float | None = None  # None before any speculative step, or without one
    context_length_tokens: int | None = None
    error: str | None = None


def server_facts(payload: Mapping[str, Any]) -> ServerFacts:
    """Read SGLang's `/server_info` body (resolved server args plus `internal_states`)."""
    states = payload.get("internal_states") or [{}]
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    accept = first.get("avg_spec_accept_length")
    context = payload.get("context_length")
    return ServerFacts(
        served_model_name=_text_or_none(payload.get("served_model_name")),
        reasoning_parser=_text_or_none(payload.get("reasoning_parser")),
        speculative_algorithm=_text_or_none(payload.get("speculative_algorithm")),
        avg_spec_accept_length=float(accept) if isinstance(accept, int | float) and accept > 0 else None,
        context_length_tokens=context if isinstance(context, int) else None,
    )


def _text_or_none(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True, kw_only=True)
class Totals:
    prompts: int
    answered: int
    completion_tokens: int
    reasoning_tokens: int
    wall_s: float
    output_tokens_per_s: float
    accept_length_tokens: float | None  # token-weighted over the responses that carried spec stats
    finish_reasons: dict[str, int]
    qualities: dict[str, int]


def summarize(outcomes: Sequence[PromptOutcome], wall_s: float) -> Totals:
    done = [outcome for outcome in outcomes if outcome.answered]
    completion = sum(outcome.completion_tokens for outcome in done)
    return Totals(
        prompts=len(outcomes),
        answered=len(done),
        completion_tokens=completion,
        reasoning_tokens=sum(outcome.reasoning_tokens for outcome in done),
        wall_s=wall_s,
        output_tokens_per_s=completion / wall_s if wall_s > 0 else 0.0,
        accept_length_tokens=_weighted_accept_length(done),
        finish_reasons=dict(Counter(str(outcome.finish_reason) for outcome in done)),
        qualities=dict(Counter(str(outcome.quality) for outcome in done)),
    )


def _weighted_accept_length(done: Sequence[PromptOutcome]) -> float | None:
    """Σ tokens ÷ Σ verify passes, as SGLang averages it (a request's passes are tokens ÷ its length)."""
    measured = [o for o in done if o.spec_accept_length and o.completion_tokens > 0]
    if not measured:
        return None
    passes = sum(o.completion_tokens / o.spec_accept_length for o in measured if o.spec_accept_length)
    return sum(o.completion_tokens for o in measured) / passes


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
                    f"check that the server is up and reachable: `python -m inference wait --url {url}`; "
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
    outcomes: Sequence[PromptOutcome], sampling: SamplingSettings, server: ServerFacts
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


def _think_tag_findings(done: Sequence[PromptOutcome], server: ServerFacts) -> list[Finding]:
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
            f"{parser}: start SGLang with --reasoning-parser qwen3 (what `python -m inference serve` "
            "passes) or the parser matching the model's chat template",
        )
    ]


def _truncation_findings(
    done: Sequence[PromptOutcome], sampling: SamplingSettings, server: ServerFacts
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


def _missing_reasoning_findings(done: Sequence[PromptOutcome], server: ServerFacts) -> list[Finding]:
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


def speculative_findings(totals: Totals, server: ServerFacts) -> list[Finding]:
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
                "which `python -m inference serve` enables by default",
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


def model_name_findings(sampling: SamplingSettings, server: ServerFacts) -> list[Finding]:
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
    server: ServerFacts,
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


@dataclass(frozen=True, kw_only=True)
class PreflightReport:
    url: str
    sampling: SamplingSettings
    outcomes: list[PromptOutcome]
    server: ServerFacts
    totals: Totals
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return verdict_of(self.findings)


def build_report(
    url: str,
    sampling: SamplingSettings,
    outcomes: Sequence[PromptOutcome],
    server: ServerFacts,
    wall_s: float,
) -> PreflightReport:
    totals = summarize(outcomes, wall_s)
    return PreflightReport(
        url=url,
        sampling=sampling,
        outcomes=list(outcomes),
        server=server,
        totals=totals,
        findings=judge(outcomes, sampling, server, totals, url),
    )


def report_to_json(report: PreflightReport) -> dict[str, Any]:
    """The report for scripts: verdict, findings, totals, per prompt (lengths, not texts), server facts."""
    totals = report.totals
    return {
        "verdict": report.verdict.value,
        "url": report.url,
        "sampling": {name: getattr(report.sampling, name) for name in SamplingSettings.__struct_fields__},
        "findings": [
            {"level": f.level.value, "problem": f.problem, "advice": f.advice} for f in report.findings
        ],
        "totals": {
            "prompts": totals.prompts,
            "answered": totals.answered,
            "completion_tokens": totals.completion_tokens,
            "reasoning_tokens": totals.reasoning_tokens,
            "wall_s": round(totals.wall_s, 3),
            "output_tokens_per_s": round(totals.output_tokens_per_s, 1),
            "accept_length_tokens": totals.accept_length_tokens,
            "finish_reasons": totals.finish_reasons,
            "qualities": totals.qualities,
        },
        "server": {
            "served_model_name": report.server.served_model_name,
            "reasoning_parser": report.server.reasoning_parser,
            "speculative_algorithm": report.server.speculative_algorithm,
            "avg_spec_accept_length": report.server.avg_spec_accept_length,
            "context_length": report.server.context_length_tokens,
            "error": report.server.error,
        },
        "prompts": [
            {
                "name": o.name,
                "finish_reason": o.finish_reason,
                "quality": None if o.quality is None else o.quality.value,
                "completion_tokens": o.completion_tokens,
                "reasoning_tokens": o.reasoning_tokens,
                "answer_chars": len(o.content),
                "reasoning_chars": len(o.reasoning_content or ""),
                "latency_s": round(o.latency_s, 3),
                "spec_accept_length": o.spec_accept_length,
                "error": o.error,
                "error_status": o.error_status,
            }
            for o in report.outcomes
        ],
    }


async def fetch_server_info(
    url: str, api_key: str | None, timeout_s: float = SERVER_INFO_TIMEOUT_S
) -> ServerFacts:
    """`/server_info`, read after the prompts so its average accept length covers them."""
    try:
        payload = await asyncio.to_thread(ServerProbe(url, api_key).read_server_info, timeout_s)
    except InferenceUnavailable as error:
        return ServerFacts(error=str(error))
    return server_facts(payload)


async def _ask(
    client: SGLangClient, prompt: PreflightPrompt, sampling: SamplingSettings, rid: str
) -> PromptOutcome:
    try:
        result = await client.chat(prompt.messages, sampling, rid)
    except InferenceError as error:
        return outcome_of_error(prompt.name, error)
    return outcome_of_result(prompt.name, result, thinking_enabled=sampling.enable_thinking)


async def run_preflight(
    url: str,
    prompts: Sequence[PreflightPrompt],
    sampling: SamplingSettings,
    *,
    api_key: str | None = None,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> PreflightReport:
    """Send every prompt at once with `sampling`, then read `/server_info`, then judge."""
    client = SGLangClient(
        ClientSettings(server_url=url, api_key=api_key, request_timeout_s=request_timeout_s)
    )
    batch = uuid.uuid4().hex[:12]
    try:
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(
                _ask(client, prompt, sampling, f"{RID_PREFIX}-{batch}-{index}")
                for index, prompt in enumerate(prompts)
            )
        )
        wall_s = time.monotonic() - started
    finally:
        await client.close()
    server = await fetch_server_info(url, api_key)
    return build_report(url, sampling, outcomes, server, wall_s)
