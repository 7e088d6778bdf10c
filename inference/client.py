"""The one way draftgen asks an SGLang server for a chat completion: streamed, so that the caller sees
each request's own progress, chunk by chunk.

Every sampling field is sent explicitly (SGLang fills omitted ones from the model's
generation_config). The exact token ids come in the stream's trailing `sglext` chunk (SGLang 0.5.23
refuses `return_token_ids` with `stream: true`). The openai client does no retrying of its own: the
caller owns the single retry layer for this hop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai

from inference.chat_stream import ChatResult, ProgressCallback, StreamAssembly, extra
from inference.client_settings import PLACEHOLDER_API_KEY, ClientSettings
from inference.errors import (
    FailureCause,
    InferenceError,
    InferenceRejected,
    InferenceUnavailable,
    transport_cause,
)
from inference.records import Message, SamplingSettings

RETRYABLE_CLIENT_STATUSES = frozenset({408, 409, 429})  # timeouts and throttling: not the request's fault


def build_request(messages: list[Message], sampling: SamplingSettings, rid: str) -> dict[str, Any]:
    """The keyword arguments of `chat.completions.create`, SGLang extras in `extra_body`."""
    request: dict[str, Any] = {
        "model": sampling.model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "max_completion_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": {
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
            "chat_template_kwargs": {"enable_thinking": sampling.enable_thinking},
            "separate_reasoning": True,
            "rid": rid,
            "return_spec_tokens_details": True,
            # SGLang 0.5.23: the exact ids a drafter trains on, the prompt's as `sglext.input_ids` and the
            # response's as `sglext.output_ids`, in one chunk after the finish (older servers send neither).
            "return_input_ids_in_sglext": True,
            "return_output_ids_in_sglext": True,
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


def retry_helps(status: int) -> bool:
    return status >= httpx.codes.INTERNAL_SERVER_ERROR or status in RETRYABLE_CLIENT_STATUSES


def status_error(status: int, text: str) -> InferenceError:
    """The error for an HTTP error status: unavailable when a retry can help, else rejected."""
    if retry_helps(status):
        return InferenceUnavailable(text, status=status, cause=FailureCause.HTTP)
    return InferenceRejected(text, status=status)


def stream_error(error: openai.APIError) -> InferenceError:
    """An error event in the stream, SGLang's `data: {"error": {..., "code": 503}}` (an abort with a status:
    out of memory, a timeout); the openai client raises it as a plain APIError with that body."""
    body = error.body if isinstance(error.body, dict) else {}
    code = body.get("code")
    status = (
        code if isinstance(code, int) and not isinstance(code, bool) else httpx.codes.INTERNAL_SERVER_ERROR
    )
    return status_error(status, f"HTTP {status} in the stream: {error.message}")


def _innermost(error: BaseException) -> BaseException:
    while (cause := error.__cause__ or error.__context__) is not None:
        error = cause
    return error


def why_no_answer(error: BaseException) -> str:
    """What really happened, from the innermost cause: the aiohttp transport reports a refused
    connection as httpx.ConnectTimeout, and openai then as APITimeoutError('Request timed out.')."""
    innermost = _innermost(error)
    if isinstance(innermost, ConnectionRefusedError):
        return "connection refused (is the server up and on this port?)"
    if isinstance(innermost, ConnectionResetError):
        return "the connection was reset"
    if isinstance(innermost, TimeoutError | httpx.TimeoutException | openai.APITimeoutError):
        return "timed out"
    return f"{type(innermost).__name__}: {innermost}"


def no_answer_cause(error: BaseException) -> FailureCause:
    """Refused, timed out or dropped; httpx's and openai's own timeouts (not builtin TimeoutErrors) too."""
    cause = transport_cause(error)
    if cause is FailureCause.DROPPED and isinstance(
        _innermost(error), httpx.TimeoutException | openai.APITimeoutError
    ):
        return FailureCause.TIMED_OUT
    return cause


class SGLangClient:
    """An async client for one server. One instance per worker process, shared by all batches."""

    def __init__(self, settings: ClientSettings, *, http_client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        # Streamed, httpx's read timeout bounds each wait for a chunk; `chat` bounds the whole request.
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

    async def chat(
        self,
        messages: list[Message],
        sampling: SamplingSettings,
        rid: str,
        on_progress: ProgressCallback | None = None,
    ) -> ChatResult:
        """One completion, streamed; `on_progress` is called on every chunk. Cancelling the call closes
        the connection, and SGLang aborts a request whose client went away."""
        started_at = time.time()
        assembly = StreamAssembly()
        timeout_s = self.settings.request_timeout_s
        try:
            async with asyncio.timeout(timeout_s) as whole_request:
                stream = await self._openai.chat.completions.create(**build_request(messages, sampling, rid))
                async with stream:
                    async for chunk in stream:
                        assembly.add(chunk)
                        if on_progress is not None:
                            on_progress()
        except TimeoutError as error:
            if not whole_request.expired():
                raise self._no_answer(error) from error
            raise InferenceUnavailable(
                f"no whole answer from {self.settings.server_url} in the request timeout ({timeout_s:g} s)",
                cause=FailureCause.TIMED_OUT,
            ) from error
        except openai.APIStatusError as error:
            raise status_error(
                error.status_code, f"HTTP {error.status_code}: {error_message(error)}"
            ) from error
        except (openai.APIConnectionError, httpx.TransportError) as error:
            raise self._no_answer(error) from error
        except openai.APIError as error:
            raise stream_error(error) from error
        return assembly.result(started_at=started_at, finished_at=time.time())

    async def context_length(self) -> int | None:
        """The server's context length in tokens: `max_model_len` in `/v1/models` (the served model
        comes first; LoRA adapters, listed after it, share its context).

        None when the server does not say (no such route, or no usable `max_model_len`). Raises
        InferenceUnavailable when it cannot answer now (no connection, 5xx, throttled)."""
        try:
            page = await self._openai.models.list()
        except openai.APIStatusError as error:
            status = error.status_code
            if retry_helps(status):
                raise InferenceUnavailable(
                    f"HTTP {status}: {error_message(error)}", status=status, cause=FailureCause.HTTP
                ) from error
            return None
        except (openai.APIConnectionError, httpx.TransportError) as error:
            raise self._no_answer(error) from error
        for model in getattr(page, "data", None) or []:
            stated = extra(model, "max_model_len")
            if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
                return stated
        return None

    def _no_answer(self, error: BaseException) -> InferenceUnavailable:
        return InferenceUnavailable(
            f"no answer from {self.settings.server_url}: {why_no_answer(error)}", cause=no_answer_cause(error)
        )

    async def close(self) -> None:
        await self._openai.close()
