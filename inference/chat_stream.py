"""What a streamed chat completion adds up to: the `ChatResult` of one request, from its chunks.

SGLang 0.5.23 streams (`serving_chat.py` `_generate_chat_stream`): a role chunk, then reasoning and
answer deltas in separate chunks (`delta.reasoning_content`, `delta.content`), a chunk with the
`finish_reason`, then, asked for, a chunk with `choices: []` and `sglext` (speculative details, the
prompt's `input_ids` and the response's `output_ids`), then one with `choices: []` and `usage`. The
ids in `sglext` are the whole lists whatever `--incremental-streaming-output` says (SGLang keeps the
last full list, or adds up the deltas), and are left out after an error abort.

Each event is decoded by msgspec into `Chunk`, which declares only what a result needs: this runs for every
chunk of every request the worker sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from core.records import Answer, TokenId, Usage
from core.run_settings.keys import MAX_TOKENS_LIMIT
from inference.errors import (
    HTTP_INTERNAL_SERVER_ERROR,
    FailureCause,
    InferenceError,
    InferenceUnavailable,
    status_error,
)

ProgressCallback = Callable[[], None]
"""Called on every chunk of a request's stream: the request's own sign of life."""

LONGEST_CONTEXT_TOKENS = MAX_TOKENS_LIMIT  # the longest context an SGLang-served model offers (1M)
TOKEN_ID_JSON_BYTES = 8  # a token id in a JSON list: at most 7 digits and ","
MAX_CHARS_PER_TOKEN = 8  # a token's text: UTF-8 of a CJK or emoji token, or JSON's six-character escapes
CHUNK_ENVELOPE_BYTES = 64 * 1024  # a chunk's fields beside its text or ids
MAX_EVENT_BYTES = 2 * LONGEST_CONTEXT_TOKENS * TOKEN_ID_JSON_BYTES + CHUNK_ENVELOPE_BYTES
"""The largest event a server sends: the trailing `sglext` chunk with a whole context's ids, twice over
(a prompt's and its answer's). Past it a stream is not an answer (16 MiB)."""
MAX_TEXT_CHARS = LONGEST_CONTEXT_TOKENS * MAX_CHARS_PER_TOKEN
"""The most text (answer and reasoning together) one request can add up to."""
STREAM_ERROR_MESSAGE = "An error occurred during streaming"  # when an error event names no message


class ChatResult(Answer, frozen=True, kw_only=True):
    """One request's answer, and when it was sent and finished (unix seconds)."""

    started_at: float
    finished_at: float


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _TokensDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None = None  # SGLang's, at the top level
    completion_tokens_details: _TokensDetails | None = None


class _Sglext(msgspec.Struct):
    """Read once, after the finish: kept raw until then, and a field of an unexpected shape is left out
    of the result rather than failing the completion (an older or newer server's extras)."""

    spec_tokens_details: msgspec.Raw = msgspec.Raw()
    input_ids: msgspec.Raw = msgspec.Raw()
    output_ids: msgspec.Raw = msgspec.Raw()


class Chunk(msgspec.Struct):
    """The fields of a `chat.completion.chunk` (or an error event) a result needs; the rest are skipped."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    sglext: _Sglext | None = None
    error: Any = None


class _SpecDetails(msgspec.Struct):
    spec_accept_length: float | None = None


_chunk_decoder = msgspec.json.Decoder(Chunk)
_ids_decoder = msgspec.json.Decoder(list[TokenId])  # an id out of a vocabulary's range: none
_id_lists_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_spec_details_decoder = msgspec.json.Decoder(_SpecDetails | list[_SpecDetails] | None)


def decode_chunk(data: bytes) -> Chunk:
    """One event's data as a chunk; InferenceUnavailable (MALFORMED) when it is not one."""
    try:
        return _chunk_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise InferenceUnavailable(
            f"a chunk of the stream is not a chat completion chunk: {error}", cause=FailureCause.MALFORMED
        ) from None


def stream_error(error: Any) -> InferenceError:
    """An error event in the stream, SGLang's `data: {"error": {..., "code": 503}}` (an abort with a status:
    out of memory, a timeout): unavailable or rejected by its code, 500 when it names none."""
    body = error if isinstance(error, dict) else {}
    message = body.get("message")
    if not message or not isinstance(message, str):
        message = STREAM_ERROR_MESSAGE
    code = body.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else HTTP_INTERNAL_SERVER_ERROR
    return status_error(status, f"HTTP {status} in the stream: {message}")


def _token_ids(raw: msgspec.Raw) -> list[int] | None:
    try:
        return _ids_decoder.decode(raw) if raw else None
    except msgspec.DecodeError:
        return None


def _first_token_ids(raw: msgspec.Raw) -> list[int] | None:
    """The first choice's ids of `output_ids` (a list per choice)."""
    try:
        per_choice = _id_lists_decoder.decode(raw) if raw else None
    except msgspec.DecodeError:
        return None
    return _token_ids(per_choice[0]) if per_choice else None


def _spec_accept_length(raw: msgspec.Raw) -> float | None:
    try:
        details = _spec_details_decoder.decode(raw) if raw else None
    except msgspec.DecodeError:
        return None
    if isinstance(details, list):
        details = details[0] if details else None
    return details.spec_accept_length if details is not None else None


def usage_of(usage: _Usage) -> Usage:
    """SGLang's usage: `reasoning_tokens` at the top level, else in `completion_tokens_details`."""
    reasoning = usage.reasoning_tokens
    if reasoning is None and usage.completion_tokens_details is not None:
        reasoning = usage.completion_tokens_details.reasoning_tokens
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        reasoning_tokens=int(reasoning or 0),
    )


class StreamAssembly:
    """Adds up the chunks of one streamed chat completion (one choice: draftgen never sends `n`)."""

    def __init__(self, max_text_chars: int = MAX_TEXT_CHARS) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._text_chars = 0
        self._max_text_chars = max_text_chars
        self._finish_reason: str | None = None
        self._usage: _Usage | None = None
        self._spec_tokens_details = msgspec.Raw()
        self._input_ids = msgspec.Raw()
        self._output_ids = msgspec.Raw()

    def add_event(self, data: bytes) -> None:
        """One event's data: a chunk, or an error event raised as the error its status says."""
        chunk = decode_chunk(data)
        if chunk.error:
            raise stream_error(chunk.error)
        self.add(chunk)

    def add(self, chunk: Chunk) -> None:
        for choice in chunk.choices:
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self._content.append(delta.content)
                    self._count(delta.content)
                if delta.reasoning_content:
                    self._reasoning.append(delta.reasoning_content)
                    self._count(delta.reasoning_content)
            if choice.finish_reason is not None:
                self._finish_reason = choice.finish_reason
        sglext = chunk.sglext
        if sglext is not None:
            self._spec_tokens_details = sglext.spec_tokens_details or self._spec_tokens_details
            self._input_ids = sglext.input_ids or self._input_ids
            self._output_ids = sglext.output_ids or self._output_ids
        if chunk.usage is not None:
            self._usage = chunk.usage

    def _count(self, text: str) -> None:
        self._text_chars += len(text)
        if self._text_chars > self._max_text_chars:
            raise InferenceUnavailable(
                f"the stream's text is past {self._max_text_chars} characters, more than any context holds",
                cause=FailureCause.MALFORMED,
            )

    def result(self, *, started_at: float, finished_at: float) -> ChatResult:
        """The request's result; InferenceUnavailable when the stream ended before its end."""
        if self._finish_reason is None:
            raise InferenceUnavailable("the stream ended without a finish reason", cause=FailureCause.DROPPED)
        if self._usage is None:
            raise InferenceUnavailable(
                "the stream ended without its usage chunk", cause=FailureCause.MALFORMED
            )
        return ChatResult(
            content="".join(self._content),
            reasoning_content="".join(self._reasoning) or None,
            finish_reason=self._finish_reason,
            usage=usage_of(self._usage),
            spec_accept_length=_spec_accept_length(self._spec_tokens_details),
            started_at=started_at,
            finished_at=finished_at,
            prompt_token_ids=_token_ids(self._input_ids),
            response_token_ids=_first_token_ids(self._output_ids),
        )
