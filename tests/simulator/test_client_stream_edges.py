"""The client reads any stream a server can frame over HTTP: events in pieces, `\\r\\n` lines, comments; and
whatever else comes (a cut, a chunk that is not one, a line past any answer, an error status's body) is a
failure with the cause and status a retry decision needs, never a crash or memory growth."""

from __future__ import annotations

import asyncio

import pytest

from core.records import Message, SamplingSettings, Usage
from inference.chat_stream import MAX_EVENT_BYTES, ChatResult
from inference.client import SGLangClient
from inference.client_settings import ClientSettings
from inference.errors import FailureCause, InferenceError, InferenceRejected, InferenceUnavailable
from tests.support import sse

PIECE_BYTES = 7  # smaller than any event: every event arrives split across reads
API_KEY = "sk-test"
THROTTLED = 429
UNAUTHORIZED = 401
BAD_GATEWAY = 502
INTERNAL_SERVER_ERROR = 500

ANSWER = (
    sse.chunk({"role": "assistant", "content": "", "reasoning_content": None}),
    sse.chunk({"reasoning_content": "thought"}),
    sse.chunk({"reasoning_content": None, "content": "answer"}),
    sse.chunk({"reasoning_content": None}, finish_reason="stop"),
    sse.chunk(
        sglext={
            "spec_tokens_details": [{"spec_accept_length": 3.5}],
            "input_ids": [1, 2],
            "output_ids": [[3, 4]],
        }
    ),
    sse.chunk(usage={"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4, "reasoning_tokens": 1}),
    sse.DONE,
)


def ask(server_url: str, api_key: str | None = None) -> ChatResult:
    async def one() -> ChatResult:
        client = SGLangClient(ClientSettings(server_url=server_url, api_key=api_key))
        try:
            return await client.chat(
                [Message(role="user", content="hi")], SamplingSettings(max_tokens=8), "r1"
            )
        finally:
            await client.close()

    return asyncio.run(one())


def failure(answer: sse.Answer) -> InferenceError:
    with sse.serving(answer) as server, pytest.raises(InferenceError) as raised:
        ask(server.url)
    return raised.value


def in_pieces(body: bytes, size: int = PIECE_BYTES) -> tuple[bytes, ...]:
    return tuple(body[i : i + size] for i in range(0, len(body), size))


def test_an_answer_streamed_in_pieces_with_crlf_lines_and_comments_adds_up_as_a_whole_one() -> None:
    body = sse.event_body(*ANSWER)
    framed = (b": ping\r\n\r\n" + body.replace(b"\n", b"\r\n")).replace(
        b"data: [DONE]", b": end\r\ndata: [DONE]"
    )
    with (
        sse.serving(sse.Answer(pieces=(body,))) as whole,
        sse.serving(sse.Answer(pieces=in_pieces(framed))) as split,
    ):
        expected, result = ask(whole.url), ask(split.url)
    assert (result.content, result.reasoning_content, result.finish_reason) == ("answer", "thought", "stop")
    assert (result.prompt_token_ids, result.response_token_ids, result.spec_accept_length) == (
        [1, 2],
        [3, 4],
        3.5,
    )
    assert result.usage == Usage(prompt_tokens=2, completion_tokens=2, reasoning_tokens=1)
    assert (result.content, result.usage, result.response_token_ids) == (
        expected.content,
        expected.usage,
        expected.response_token_ids,
    )


def test_the_request_carries_the_api_key_and_every_sglang_extra_at_the_top_of_its_body() -> None:
    with sse.serving(sse.event_stream(*ANSWER)) as server:
        ask(server.url, api_key=API_KEY)
    [seen] = server.requests
    assert seen.headers["authorization"] == f"Bearer {API_KEY}"
    assert b'"rid":"r1"' in seen.body and b"extra_body" not in seen.body


def test_a_stream_cut_in_the_middle_of_an_event_is_dropped() -> None:
    body = sse.event_body(*ANSWER[:3])
    error = failure(sse.Answer(pieces=(body, b'data: {"choices":[{"delta":'), cut=True))
    assert isinstance(error, InferenceUnavailable) and error.cause is FailureCause.DROPPED
    assert error.server_unreachable


def test_a_chunk_that_is_not_json_is_malformed_not_a_crash() -> None:
    error = failure(sse.event_stream(ANSWER[0], "{not json", *ANSWER[1:]))
    assert isinstance(error, InferenceUnavailable) and error.cause is FailureCause.MALFORMED


def test_a_line_past_any_answer_is_malformed_before_it_is_read_whole() -> None:
    endless = b"data: " + b"x" * (MAX_EVENT_BYTES + 1)
    error = failure(sse.Answer(pieces=(sse.event_body(ANSWER[0]), endless)))
    assert isinstance(error, InferenceUnavailable) and error.cause is FailureCause.MALFORMED


def test_an_error_event_without_message_or_code_is_a_server_error() -> None:
    error = failure(sse.event_stream(ANSWER[0], {"error": {"object": "error"}}, *ANSWER[1:]))
    assert isinstance(error, InferenceUnavailable)
    assert (error.status, error.cause) == (INTERNAL_SERVER_ERROR, FailureCause.HTTP)
    assert "An error occurred during streaming" in str(error)


@pytest.mark.parametrize(
    ("status", "body", "expected", "text"),
    [
        (UNAUTHORIZED, {"error": "Unauthorized"}, InferenceRejected, "HTTP 401: Unauthorized"),
        (
            THROTTLED,
            {"object": "error", "message": "too many", "code": 429},
            InferenceUnavailable,
            "too many",
        ),
        (BAD_GATEWAY, {"error": {"message": "upstream gone"}}, InferenceUnavailable, "upstream gone"),
    ],
)
def test_an_error_status_gives_sglang_s_message_and_says_whether_a_retry_helps(
    status: int, body: object, expected: type[InferenceError], text: str
) -> None:
    error = failure(sse.json_answer(status, body))
    assert isinstance(error, expected) and text in str(error)
    assert getattr(error, "status", None) == status


def test_an_error_status_with_a_body_that_is_not_json_keeps_its_text() -> None:
    error = failure(
        sse.Answer(status=BAD_GATEWAY, pieces=(b"<html>bad gateway</html>",), content_type="text/html")
    )
    assert isinstance(error, InferenceUnavailable) and "bad gateway" in str(error)
