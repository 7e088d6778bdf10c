"""The chat request as SGLang 0.5.23 reads it, its validation, and SGLang's error bodies.

Unknown fields are ignored (ChatCompletionRequest has no extra="forbid"). Messages are the ones of
`sampling_params.verify`, `serving_chat.py` and `tokenizer_manager.py` (see the reference sheet).
"""

from __future__ import annotations

import dataclasses
from http import HTTPStatus
from typing import Any

import msgspec

from inference.simulator.settings import SimulatorSettings
from inference.simulator.thinking import context_error, count_prompt_tokens

MAX_PENALTY = 2.0
MAX_REPETITION_PENALTY = 2.0

# Every field a client may send that shapes sampling or the output; recorded as received.
RECORDED_FIELDS = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "n",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "min_tokens",
    "ignore_eos",
    "no_stop_trim",
    "skip_special_tokens",
    "chat_template_kwargs",
    "reasoning_effort",
    "separate_reasoning",
    "stream_reasoning",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "custom_params",
    "priority",
    "response_format",
    "return_spec_tokens_details",
    "return_meta_info",
    "return_token_ids",
    "return_prompt_token_ids",
    "return_input_ids_in_sglext",
    "return_output_ids_in_sglext",
)

# With stream=true each is refused, in this order (`serving_chat.py` `_convert_to_internal_request`).
STREAM_REFUSED_FLAGS = (
    (
        "return_prompt_token_ids",
        "return_prompt_token_ids is not supported with streaming. "
        "Please set stream=false when using return_prompt_token_ids=true.",
    ),
    (
        "return_token_ids",
        "return_token_ids is not supported with streaming on /v1/chat/completions. "
        "Please set stream=false when using return_token_ids=true.",
    ),
    (
        "return_meta_info",
        "return_meta_info is not supported with streaming. "
        "Please set stream=false when using return_meta_info=true.",
    ),
)


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class ChatRequest(msgspec.Struct, kw_only=True):
    """The fields the simulator acts on; everything else is accepted and ignored."""

    messages: list[dict[str, Any]]
    model: str = "default"
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    no_stop_trim: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    rid: str | None = None
    return_spec_tokens_details: bool = False
    return_meta_info: bool = False
    return_token_ids: bool = False
    return_prompt_token_ids: bool = False
    return_input_ids_in_sglext: bool = False
    return_output_ids_in_sglext: bool = False

    @property
    def max_new_tokens(self) -> int | None:
        """SGLang's `max_completion_tokens or max_tokens` (so 0 counts as unset in the first)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def enable_thinking(self) -> bool:
        """Thinking is on unless enable_thinking is exactly false (reasoning_effort "none" defaults it)."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            kwargs.setdefault("enable_thinking", self.reasoning_effort != "none")
        return kwargs.get("enable_thinking") is not False

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self, settings: SimulatorSettings) -> bool:
        if self.stream_options is not None and self.stream_options.include_usage is not None:
            return self.stream_options.include_usage
        return settings.stream_response_default_include_usage


@dataclasses.dataclass(frozen=True)
class RequestError(Exception):
    """An error answered with SGLang's top-level error body."""

    status: int
    message: str
    error_type: str

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.status)


def error_body(message: str, error_type: str, code: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": error_type, "param": None, "code": code}


def bad_request(message: str) -> RequestError:
    """A ValueError inside SGLang: 400 BadRequestError."""
    return RequestError(HTTPStatus.BAD_REQUEST, message, "BadRequestError")


def conversion_error(message: str) -> RequestError:
    """A ValueError while SGLang converts the request (`serving_base.handle_request`): type "BadRequest"."""
    return RequestError(HTTPStatus.BAD_REQUEST, message, "BadRequest")


def invalid_body(message: str) -> RequestError:
    """A request-validation failure (pydantic or Content-Type): 400 with type "Bad Request"."""
    return RequestError(HTTPStatus.BAD_REQUEST, message, "Bad Request")


def http_exception(status: int, message: str) -> RequestError:
    """An HTTPException inside SGLang: the status as the type, e.g. "503"."""
    return RequestError(status, message, str(status))


def internal_error(message: str) -> RequestError:
    return RequestError(
        HTTPStatus.INTERNAL_SERVER_ERROR, f"Internal server error: {message}", "InternalServerError"
    )


def stream_error_event(status: int, message: str) -> dict[str, Any]:
    """The body of an error sent inside an SSE stream."""
    return {"error": error_body(message, HTTPStatus(status).name, status)}


def parse_chat_request(content_type: str, payload: bytes) -> tuple[dict[str, Any], ChatRequest]:
    """(raw JSON object, typed request); raises RequestError for a bad content type or body."""
    if content_type != "application/json":
        raise invalid_body(
            "[{'type': 'value_error', 'loc': ('header', 'content-type'), "
            "'msg': \"Unsupported Media Type: Only 'application/json' is allowed\"}]"
        )
    try:
        raw = msgspec.json.decode(payload)
    except msgspec.DecodeError as exc:
        raise invalid_body(
            f"[{{'type': 'json_invalid', 'loc': ('body', 0), 'msg': 'JSON decode error: {exc}'}}]"
        ) from exc
    if not isinstance(raw, dict):
        raise invalid_body(
            "[{'type': 'model_attributes_type', 'loc': ('body',), "
            "'msg': 'Input should be a valid dictionary or object to extract fields from'}]"
        )
    try:
        return raw, msgspec.convert(raw, ChatRequest)
    except msgspec.ValidationError as exc:
        raise invalid_body(f"1 validation error for ChatCompletionRequest: {exc}") from exc


def _check_sampling(request: ChatRequest, max_new_tokens: int | None) -> None:
    """`SamplingParams.verify`."""
    checks: list[tuple[bool, str]] = [
        (
            request.temperature is not None and request.temperature < 0,
            f"temperature must be non-negative, got {request.temperature}.",
        ),
        (
            request.top_p is not None and not 0 < request.top_p <= 1,
            f"top_p must be in (0, 1], got {request.top_p}.",
        ),
        (
            request.min_p is not None and not 0 <= request.min_p <= 1,
            f"min_p must be in [0, 1], got {request.min_p}.",
        ),
        (
            request.top_k is not None and (request.top_k < -1 or request.top_k == 0),
            f"top_k must be -1 (disable), or at least 1, got {request.top_k}.",
        ),
        (
            request.frequency_penalty is not None
            and not -MAX_PENALTY <= request.frequency_penalty <= MAX_PENALTY,
            f"frequency_penalty must be in [-2, 2], got {request.frequency_penalty}.",
        ),
        (
            request.presence_penalty is not None
            and not -MAX_PENALTY <= request.presence_penalty <= MAX_PENALTY,
            f"presence_penalty must be in [-2, 2], got {request.presence_penalty}.",
        ),
        (
            request.repetition_penalty is not None
            and not 0 < request.repetition_penalty <= MAX_REPETITION_PENALTY,
            f"repetition_penalty must be in (0, 2], got {request.repetition_penalty}.",
        ),
        (
            max_new_tokens is not None and max_new_tokens < 0,
            f"max_new_tokens must be at least 0, got {max_new_tokens}.",
        ),
        (
            request.min_tokens < 0
            or (max_new_tokens is not None and request.min_tokens > max(0, max_new_tokens)),
            f"min_new_tokens must be in [0, max_new_tokens], got {request.min_tokens}.",
        ),
    ]
    for failed, message in checks:
        if failed:
            raise bad_request(message)


def validate_chat_request(settings: SimulatorSettings, request: ChatRequest) -> int:
    """SGLang's checks, in its order; returns the prompt token count."""
    if not request.messages:
        raise bad_request("Messages cannot be empty.")
    if request.chat_template_kwargs and "chat_template" in request.chat_template_kwargs:
        raise bad_request(
            "Request-supplied chat_template is not allowed. Start the server "
            "with --trust-request-chat-template to permit it."
        )
    max_new_tokens = request.max_new_tokens
    if max_new_tokens is not None and max_new_tokens > settings.context_length:
        raise bad_request(
            f"max_completion_tokens is too large: {max_new_tokens}."
            f"This model supports at most {settings.context_length} completion tokens."
        )
    if request.stream:
        for flag, message in STREAM_REFUSED_FLAGS:
            if getattr(request, flag):
                raise conversion_error(message)
    if request.n != 1:
        raise bad_request(f"The simulator serves n=1 only, got n={request.n}.")
    prompt_tokens = count_prompt_tokens(request.messages)
    too_long = context_error(settings, prompt_tokens, max_new_tokens)
    if too_long is not None:
        raise bad_request(too_long)
    if prompt_tokens > settings.max_total_tokens:
        raise bad_request(f"Request prompt exceeds the KV memory budget: input_len={prompt_tokens}.")
    _check_sampling(request, max_new_tokens)
    return prompt_tokens
