"""The report: outcomes, server facts, totals and findings together, and its JSON for scripts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from core.records import SamplingSettings
from node.preflight.judging import Finding, Verdict, judge, verdict_of
from node.preflight.outcomes import PromptOutcome, ServerReading, Totals, summarize

SERVER_JSON_NAMES = {"context_length_tokens": "context_length"}
"""ServerReading fields named otherwise in the JSON (SGLang's own name)."""
PROMPT_JSON_FIELDS = (
    "name",
    "finish_reason",
    "quality",
    "completion_tokens",
    "reasoning_tokens",
    "answer_chars",
    "reasoning_chars",
    "latency_s",
    "spec_accept_length",
    "error",
    "error_status",
)
"""A prompt's entry in the JSON, in order: lengths, not the texts themselves."""


@dataclass(frozen=True, kw_only=True)
class PreflightReport:
    url: str
    sampling: SamplingSettings
    outcomes: list[PromptOutcome]
    server: ServerReading
    totals: Totals
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return verdict_of(self.findings)


def build_report(
    url: str,
    sampling: SamplingSettings,
    outcomes: Sequence[PromptOutcome],
    server: ServerReading,
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
    totals = msgspec.to_builtins(report.totals)
    totals["wall_s"] = round(report.totals.wall_s, 3)
    totals["output_tokens_per_s"] = round(report.totals.output_tokens_per_s, 1)
    server = msgspec.to_builtins(report.server)
    return {
        "verdict": report.verdict.value,
        "url": report.url,
        "sampling": msgspec.to_builtins(report.sampling),
        "findings": msgspec.to_builtins(report.findings),
        "totals": totals,
        "server": {SERVER_JSON_NAMES.get(name, name): value for name, value in server.items()},
        "prompts": [_prompt_to_json(outcome) for outcome in report.outcomes],
    }


def _prompt_to_json(outcome: PromptOutcome) -> dict[str, Any]:
    fields = msgspec.to_builtins(outcome) | {
        "answer_chars": len(outcome.content),
        "reasoning_chars": len(outcome.reasoning_content or ""),
        "latency_s": round(outcome.latency_s, 3),
    }
    return {name: fields[name] for name in PROMPT_JSON_FIELDS}
