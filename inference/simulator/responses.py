"""Response bodies: the chat completion, its SSE chunks, usage and `sglext`.

Shapes of `serving_chat.py` / `protocol.py` in SGLang 0.5.23: `id` is the rid, `content` is never
null, `reasoning_content` is null when empty, `usage.reasoning_tokens` is always present, the choice
keys `prompt_token_ids` / `response_token_ids` and the response key `sglext` are left out when None.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from inference.simulator.settings import SimulatorSettings

WEIGHT_VERSION = "default"


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int | None = None  # reported only with --enable-cache-report

    def body(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": (
                None if self.cached_tokens is None else {"cached_tokens": self.cached_tokens}
            ),
            "reasoning_tokens": self.reasoning_tokens,
            "completion_tokens_details": (
                {"reasoning_tokens": self.reasoning_tokens} if self.reasoning_tokens > 0 else None
            ),
        }


def spec_tokens_details(
    settings: SimulatorSettings, completion_tokens: int, verify_count: int
) -> dict[str, Any] | None:
    """Per-request speculative stats (`tokenizer_manager.py`), only when at least one verify ran."""
    if verify_count <= 0:
        return None
    drafts_per_verify = settings.speculative_num_draft_tokens - 1
    correct = max(0, min(completion_tokens - verify_count, verify_count * drafts_per_verify))
    histogram = [0] * (drafts_per_verify + 1)
    low, extra = divmod(correct, verify_count)  # `extra` verifies accepted one more draft
    histogram[low] += verify_count - extra
    if extra:
        histogram[min(low + 1, drafts_per_verify)] += extra
    accept_length = completion_tokens / verify_count
    return {
        "spec_verify_ct": verify_count,
        "spec_accept_length": accept_length,
        "spec_accept_rate": correct / (verify_count * drafts_per_verify) if drafts_per_verify else 0.0,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": verify_count * drafts_per_verify,
        "spec_correct_drafts_histogram": histogram,
        "spec_cap_length": settings.speculative_num_draft_tokens,
        "spec_block_accept_length": accept_length,
    }


@dataclasses.dataclass(frozen=True, slots=True)
class ChatResult:
    """Everything a finished request's response is made of."""

    rid: str
    created: int
    model: str
    reasoning_content: str | None
    content: str
    finish_reason: str
    matched_stop: int | str | None
    usage: Usage
    sglext: dict[str, Any] | None  # response level: spec_tokens_details, input_ids, output_ids
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None


def chat_completion_body(result: ChatResult) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": result.content,
            "reasoning_content": result.reasoning_content,
        },
        "logprobs": None,
        "finish_reason": result.finish_reason,
        "matched_stop": result.matched_stop,
    }
    if result.prompt_token_ids is not None:
        choice["prompt_token_ids"] = result.prompt_token_ids
    if result.response_token_ids is not None:
        choice["response_token_ids"] = result.response_token_ids
    body: dict[str, Any] = {
        "id": result.rid,
        "object": "chat.completion",
        "created": result.created,
        "model": result.model,
        "choices": [choice],
        "usage": result.usage.body(),
        "metadata": {"weight_version": WEIGHT_VERSION},
    }
    if result.sglext is not None:
        body["sglext"] = result.sglext
    return body


def chunk_body(
    rid: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    *,
    finish_reason: str | None = None,
    matched_stop: int | str | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched_stop,
            }
        ],
    }


def empty_choices_chunk(rid: str, created: int, model: str, **extra: Any) -> dict[str, Any]:
    """The trailing `choices: []` chunk that carries `usage` or `sglext`. SGLang serialises it with
    pydantic, which writes `usage: null` and drops only a None `sglext`."""
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": None,
        **extra,
    }


# SGLang's `StreamDelta` (`sse_utils.py`) is a msgspec struct with omit_defaults: `role` and `content`
# are left out when None, `reasoning_content` is always written (null or text), in this key order.
FIRST_DELTA: dict[str, Any] = {"reasoning_content": None, "role": "assistant", "content": ""}
FINISH_DELTA: dict[str, Any] = {"reasoning_content": None}


def reasoning_delta(text: str) -> dict[str, Any]:
    return {"reasoning_content": text}


def content_delta(text: str) -> dict[str, Any]:
    return {"reasoning_content": None, "content": text}
