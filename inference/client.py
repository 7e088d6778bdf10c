"""The one way draftgen asks an SGLang server for a chat completion: streamed, so that the caller sees
each request's own progress, chunk by chunk.

Every sampling field is sent explicitly (SGLang fills omitted ones from the model's
generation_config). The exact token ids come in the stream's trailing `sglext` chunk (SGLang 0.5.23
refuses `return_token_ids` with `stream: true`). The stream is read straight off aiohttp and decoded with
msgspec, declaring only the fields a result needs: it runs for every chunk of every request, and the
openai client's models cost ~125 µs of a worker's CPU per chunk. No retrying here: the caller owns the
single retry layer for this hop.
"""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus
from typing import Any

import aiohttp
import msgspec

from core.records import Message, SamplingSettings
from inference.chat_stream import MAX_EVENT_BYTES, ChatResult, ProgressCallback, StreamAssembly
from inference.client_settings import PLACEHOLDER_API_KEY, ClientSettings
from inference.errors import (
    FailureCause,
    InferenceUnavailable,
    retry_helps,
    status_error,
    transport_cause,
)
from inference.sse import EventReader

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
DONE = b"[DONE]"
ERROR_BODY_MAX_BYTES = 64 * 1024  # an error status's body: SGLang's are a few hundred bytes
MODELS_BODY_MAX_BYTES = 1024 * 1024  # `/v1/models`: the served model and its LoRA adapters
SUCCESS_STATUSES = range(HTTPStatus.OK, HTTPStatus.MULTIPLE_CHOICES)


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


def request_body(messages: list[Message], sampling: SamplingSettings, rid: str) -> bytes:
    """The JSON body the openai client sends for `build_request`: its `extra_body` flattened into it."""
    request = build_request(messages, sampling, rid)
    extras = request.pop("extra_body")
    return msgspec.json.encode({**request, **extras})


def error_message(raw: bytes) -> str:
    """SGLang's error text: its bodies are `{"object":"error","message":…}` or `{"error":…}`."""
    text = raw.decode(errors="replace")
    try:
        body: Any = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return text
    if isinstance(body, dict):
        body = body.get("error", body)
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    if isinstance(body, str) and body:
        return body
    return text


async def _read_at_most(content: aiohttp.StreamReader, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while size < max_bytes and (piece := await content.read(max_bytes - size)):
        parts.append(piece)
        size += len(piece)
    return b"".join(parts)


def _innermost(error: BaseException) -> BaseException:
    while (cause := error.__cause__ or error.__context__) is not None:
        error = cause
    return error


def why_no_answer(error: BaseException) -> str:
    """What really happened, in words, from the innermost cause."""
    innermost = _innermost(error)
    if isinstance(innermost, ConnectionRefusedError):
        return "connection refused (is the server up and on this port?)"
    if isinstance(innermost, ConnectionResetError):
        return "the connection was reset"
    if isinstance(innermost, TimeoutError):
        return "timed out"
    return f"{type(innermost).__name__}: {innermost}"


class _Model(msgspec.Struct):
    max_model_len: Any = None


class _ModelList(msgspec.Struct):
    data: list[_Model] = []


class SGLangClient:
    """An async client for one server. One instance per worker process, shared by all batches; its
    connection pool is made on first use, on the loop that uses it."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        base_url = settings.server_url.rstrip("/")
        self._chat_url = base_url + CHAT_PATH
        self._models_url = base_url + MODELS_PATH
        self._headers = {
            "Authorization": f"Bearer {settings.api_key or PLACEHOLDER_API_KEY}",
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
        }
        # `chat` and `context_length` bound their whole request, which bounds each wait for a chunk too: no
        # read timeout, whose timer aiohttp would set again on every chunk.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.settings.max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

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
                await self._stream(request_body(messages, sampling, rid), assembly, on_progress)
        except TimeoutError as error:
            if not whole_request.expired():
                raise self._no_answer(error) from error
            raise InferenceUnavailable(
                f"no whole answer from {self.settings.server_url} in the request timeout ({timeout_s:g} s)",
                cause=FailureCause.TIMED_OUT,
            ) from error
        except aiohttp.ClientError as error:
            raise self._no_answer(error) from error
        return assembly.result(started_at=started_at, finished_at=time.time())

    async def _stream(
        self, body: bytes, assembly: StreamAssembly, on_progress: ProgressCallback | None
    ) -> None:
        async with self._pool().post(
            self._chat_url, data=body, headers=self._headers, allow_redirects=False
        ) as response:
            try:
                await self._read(response, assembly, on_progress)
            except BaseException:
                response.close()  # at once, not drained: SGLang aborts a request whose client went away
                raise

    @staticmethod
    async def _read(
        response: aiohttp.ClientResponse, assembly: StreamAssembly, on_progress: ProgressCallback | None
    ) -> None:
        """Add the stream's chunks up to its `[DONE]` (or its end: the result says what is missing)."""
        status = response.status
        if status not in SUCCESS_STATUSES:
            raw = await _read_at_most(response.content, ERROR_BODY_MAX_BYTES)
            raise status_error(status, f"HTTP {status}: {error_message(raw)}")
        events = EventReader(MAX_EVENT_BYTES)
        async for piece in response.content.iter_any():
            for data in events.feed(piece):
                if data.startswith(DONE):
                    return  # leaving the response gives its connection back once the stream ended
                assembly.add_event(data)
                if on_progress is not None:
                    on_progress()

    async def context_length(self) -> int | None:
        """The server's context length in tokens: `max_model_len` in `/v1/models` (the served model
        comes first; LoRA adapters, listed after it, share its context).

        None when the server does not say (no such route, or no usable `max_model_len`). Raises
        InferenceUnavailable when it cannot answer now (no connection, 5xx, throttled)."""
        deadline = asyncio.timeout(self.settings.request_timeout_s)
        try:
            async with deadline, self._pool().get(self._models_url, headers=self._headers) as response:
                status = response.status
                raw = await _read_at_most(response.content, MODELS_BODY_MAX_BYTES)
        except (aiohttp.ClientError, TimeoutError) as error:
            if deadline.expired():
                raise InferenceUnavailable(
                    f"no answer from {self.settings.server_url}: timed out", cause=FailureCause.TIMED_OUT
                ) from error
            raise self._no_answer(error) from error
        if status not in SUCCESS_STATUSES:
            if retry_helps(status):
                raise InferenceUnavailable(
                    f"HTTP {status}: {error_message(raw)}", status=status, cause=FailureCause.HTTP
                )
            return None
        try:
            page = msgspec.json.decode(raw, type=_ModelList)
        except msgspec.DecodeError:
            return None
        for model in page.data:
            stated = model.max_model_len
            if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
                return stated
        return None

    def _no_answer(self, error: BaseException) -> InferenceUnavailable:
        return InferenceUnavailable(
            f"no answer from {self.settings.server_url}: {why_no_answer(error)}", cause=transport_cause(error)
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
