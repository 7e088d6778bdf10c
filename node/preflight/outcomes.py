"""What preflight observed: one outcome per prompt, the server's `/server_info` facts, and the totals."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.records import Quality
from inference.errors import InferenceError, InferenceRejected
from inference.quality import label_completion
from inference.server_facts import facts_from_server_info
from inference.server_probe import accept_length_from_server_info

if TYPE_CHECKING:  # the client pulls in openai; these rules only read its results
    from inference.chat_stream import ChatResult

THINK_TAGS = ("<think>", "</think>")


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
class ServerReading:
    """What preflight reads of `/server_info` for its verdict: a few of the server's facts
    (`inference.server_facts`) and its live accept length; every field None when it could not be read."""

    served_model_name: str | None = None
    reasoning_parser: str | None = None
    speculative_algorithm: str | None = None
    avg_spec_accept_length: float | None = None  # None before any speculative step, or without one
    context_length_tokens: int | None = None
    error: str | None = None


def server_reading(payload: Mapping[str, Any]) -> ServerReading:
    """Read SGLang's `/server_info` body (resolved server args plus `internal_states`)."""
    facts = facts_from_server_info(payload, server_url="")
    accept = accept_length_from_server_info(payload)
    return ServerReading(
        served_model_name=facts.served_model_name or None,
        reasoning_parser=facts.reasoning_parser or None,
        speculative_algorithm=facts.speculative_algorithm or None,
        avg_spec_accept_length=accept if accept is not None and accept > 0 else None,
        context_length_tokens=facts.context_length,
    )


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
