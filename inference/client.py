"""The one way draftgen asks an SGLang server for a chat completion.

Every sampling field is sent explicitly (SGLang fills omitted ones from the model's
generation_config). The openai client does no retrying of its own: the caller owns the single
retry layer for this hop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from inference.client_settings import PLACEHOLDER_API_KEY, ClientSettings
from inference.errors import InferenceRejected, InferenceUnavailable
from inference.records import Message, SamplingSettings, Usage

RETRYABLE_CLIENT_STATUSES = frozenset({408, 409, 429})  # timeouts and throttling: not the request's fault


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


def build_request(messages: list[Message], sampling: SamplingSettings, rid: str) -> dict[str, Any]:
    """The keyword arguments of `chat.completions.create`, SGLang extras in `extra_body`."""
    request: dict[str, Any] = {
        "model": sampling.model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "max_completion_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "extra_body": {
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
            "chat_template_kwargs": {"enable_thinking": sampling.enable_thinking},
            "separate_reasoning": True,
            "rid": rid,
            "return_spec_tokens_details": True,
            # SGLang 0.5.23: each choice gets `prompt_token_ids` and `response_token_ids`, the exact
            # ids a drafter trains on (older servers ignore the field and return neither).
            "return_token_ids": True,
        },
    }
    if sampling.seed is not None:
        request["seed"] = sampling.seed
    return request


def error_message(error: openai.APIStatusError) -> str:
    """SGLang's error text: its bodies are `{"object":"error","message":…}` or `{"error":…}`."""
    body = error.body
    if isinstance(body, str) and body:
        return body  # the openai client unwraps {"error": "Unauthorized"} to its value
    if isinstance(body, dict):
        nested = body.get("error")
        if isinstance(nested, dict) and "message" in nested:
            return str(nested["message"])
        if "message" in body:
            return str(body["message"])
        if isinstance(nested, str):
            return nested
    return str(error.message)


def _extra(model: Any, name: str) -> Any:
    extras = getattr(model, "model_extra", None) or {}
    return extras.get(name, getattr(model, name, None))


def _spec_accept_length(response: Any) -> float | None:
    details = (_extra(response, "sglext") or {}).get("spec_tokens_details")
    if isinstance(details, list):
        details = details[0] if details else None
    if isinstance(details, dict) and details.get("spec_accept_length") is not None:
        return float(details["spec_accept_length"])
    return None


def _token_ids(choice: Any, name: str) -> list[int] | None:
    ids = _extra(choice, name)
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return ids
    return None


def _usage(response: Any) -> Usage:
    usage = response.usage
    reasoning = _extra(usage, "reasoning_tokens")
    if reasoning is None and usage.completion_tokens_details is not None:
        reasoning = usage.completion_tokens_details.reasoning_tokens
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        reasoning_tokens=int(reasoning or 0),
    )


def why_no_answer(error: BaseException) -> str:
    """What really happened, from the innermost cause: the aiohttp transport reports a refused
    connection as httpx.ConnectTimeout, and openai then as APITimeoutError('Request timed out.')."""
    innermost = error
    while (cause := innermost.__cause__ or innermost.__context__) is not None:
        innermost = cause
    if isinstance(innermost, ConnectionRefusedError):
        return "connection refused (is the server up and on this port?)"
    if isinstance(innermost, ConnectionResetError):
        return "the connection was reset"
    if isinstance(innermost, TimeoutError | httpx.TimeoutException | openai.APITimeoutError):
        return "timed out"
    return f"{type(innermost).__name__}: {innermost}"


class SGLangClient:
    """An async client for one server. One instance per worker process, shared by all batches."""

    def __init__(self, settings: ClientSettings, *, http_client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        timeout = httpx.Timeout(settings.request_timeout_s, connect=settings.connect_timeout_s)
        limits = httpx.Limits(
            max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections
        )
        self._openai = openai.AsyncOpenAI(
            base_url=settings.server_url.rstrip("/") + "/v1",
            api_key=settings.api_key or PLACEHOLDER_API_KEY,
            max_retries=0,
            timeout=timeout,
            # aiohttp underneath: httpx's own pool managed ~200 requests/s here, aiohttp over 1,000.
            http_client=http_client or openai.DefaultAioHttpClient(timeout=timeout, limits=limits),
        )

    async def chat(self, messages: list[Message], sampling: SamplingSettings, rid: str) -> ChatResult:
        started_at = time.time()
        try:
            response = await self._openai.chat.completions.create(**build_request(messages, sampling, rid))
        except openai.APIStatusError as error:
            status = error.status_code
            text = f"HTTP {status}: {error_message(error)}"
            if status >= httpx.codes.INTERNAL_SERVER_ERROR or status in RETRYABLE_CLIENT_STATUSES:
                raise InferenceUnavailable(text, status=status) from error
            raise InferenceRejected(text, status=status) from error
        except (openai.APIConnectionError, httpx.TransportError) as error:
            raise self._no_answer(error) from error
        if not response.choices:
            raise InferenceUnavailable("the server answered without a choice", status=httpx.codes.OK)
        choice = response.choices[0]
        return ChatResult(
            content=choice.message.content or "",
            reasoning_content=_extra(choice.message, "reasoning_content"),
            finish_reason=str(choice.finish_reason),
            usage=_usage(response),
            spec_accept_length=_spec_accept_length(response),
            started_at=started_at,
            finished_at=time.time(),
            prompt_token_ids=_token_ids(choice, "prompt_token_ids"),
            response_token_ids=_token_ids(choice, "response_token_ids"),
        )

    async def context_length(self) -> int | None:
        """The server's context length in tokens: `max_model_len` in `/v1/models` (the served model
        comes first; LoRA adapters, listed after it, share its context).

        None when the server does not say (no such route, or no usable `max_model_len`). Raises
        InferenceUnavailable when it cannot answer now (no connection, 5xx, throttled)."""
        try:
            page = await self._openai.models.list()
        except openai.APIStatusError as error:
            status = error.status_code
            if status >= httpx.codes.INTERNAL_SERVER_ERROR or status in RETRYABLE_CLIENT_STATUSES:
                raise InferenceUnavailable(f"HTTP {status}: {error_message(error)}", status=status) from error
            return None
        except (openai.APIConnectionError, httpx.TransportError) as error:
            raise self._no_answer(error) from error
        for model in getattr(page, "data", None) or []:
            stated = _extra(model, "max_model_len")
            if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
                return stated
        return None

    def _no_answer(self, error: BaseException) -> InferenceUnavailable:
        return InferenceUnavailable(f"no answer from {self.settings.server_url}: {why_no_answer(error)}")

    async def close(self) -> None:
        await self._openai.close()
