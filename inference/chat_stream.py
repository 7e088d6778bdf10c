"""What a streamed chat completion adds up to: the `ChatResult` of one request, from its chunks.

SGLang 0.5.23 streams (`serving_chat.py` `_generate_chat_stream`): a role chunk, then reasoning and
answer deltas in separate chunks (`delta.reasoning_content`, `delta.content`), a chunk with the
`finish_reason`, then, asked for, a chunk with `choices: []` and `sglext` (speculative details, the
prompt's `input_ids` and the response's `output_ids`), then one with `choices: []` and `usage`. The
ids in `sglext` are the whole lists whatever `--incremental-streaming-output` says (SGLang keeps the
last full list, or adds up the deltas), and are left out after an error abort.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inference.errors import FailureCause, InferenceUnavailable
from inference.records import Usage

ProgressCallback = Callable[[], None]
"""Called on every chunk of a request's stream: the request's own sign of life."""


@dataclass(frozen=True)
class ChatResult:
    content: str
    reasoning_content: str | None
    finish_reason: str
    usage: Usage
    spec_accept_length: float | None
    started_at: float
    finished_at: float
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None


def extra(model: Any, name: str) -> Any:
    """An SGLang field the openai models do not declare: kept by pydantic in `model_extra`."""
    extras = getattr(model, "model_extra", None) or {}
    return extras.get(name, getattr(model, name, None))


def _token_ids(ids: Any) -> list[int] | None:
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return ids
    return None


def _spec_accept_length(sglext: dict[str, Any]) -> float | None:
    details = sglext.get("spec_tokens_details")
    if isinstance(details, list):
        details = details[0] if details else None
    if isinstance(details, dict) and details.get("spec_accept_length") is not None:
        return float(details["spec_accept_length"])
    return None


def usage_of(usage: Any) -> Usage:
    """SGLang's usage: `reasoning_tokens` at the top level, else in `completion_tokens_details`."""
    reasoning = extra(usage, "reasoning_tokens")
    if reasoning is None and usage.completion_tokens_details is not None:
        reasoning = usage.completion_tokens_details.reasoning_tokens
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        reasoning_tokens=int(reasoning or 0),
    )


class StreamAssembly:
    """Adds up the chunks of one streamed chat completion (one choice: draftgen never sends `n`)."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._finish_reason: str | None = None
        self._usage: Any = None
        self._sglext: dict[str, Any] = {}

    def add(self, chunk: Any) -> None:
        for choice in chunk.choices:
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self._content.append(delta.content)
                reasoning = extra(delta, "reasoning_content")
                if reasoning:
                    self._reasoning.append(reasoning)
            if choice.finish_reason is not None:
                self._finish_reason = str(choice.finish_reason)
        sglext = extra(chunk, "sglext")
        if isinstance(sglext, dict):
            self._sglext.update(sglext)
        if chunk.usage is not None:
            self._usage = chunk.usage

    def result(self, *, started_at: float, finished_at: float) -> ChatResult:
        """The request's result; InferenceUnavailable when the stream ended before its end."""
        if self._finish_reason is None:
            raise InferenceUnavailable("the stream ended without a finish reason", cause=FailureCause.DROPPED)
        if self._usage is None:
            raise InferenceUnavailable(
                "the stream ended without its usage chunk", cause=FailureCause.MALFORMED
            )
        output_ids = self._sglext.get("output_ids")
        return ChatResult(
            content="".join(self._content),
            reasoning_content="".join(self._reasoning) or None,
            finish_reason=self._finish_reason,
            usage=usage_of(self._usage),
            spec_accept_length=_spec_accept_length(self._sglext),
            started_at=started_at,
            finished_at=finished_at,
            prompt_token_ids=_token_ids(self._sglext.get("input_ids")),
            response_token_ids=_token_ids(output_ids[0])
            if isinstance(output_ids, list) and output_ids
            else None,
        )
