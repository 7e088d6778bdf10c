"""When a server gives no answer, the error says what happened, in words and as its cause: refused is
not a timeout."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from core.records import Message, SamplingSettings
from devstack.local_stack import free_port
from inference.client import SGLangClient
from inference.client_settings import ClientSettings
from inference.errors import FailureCause, InferenceUnavailable

SHORT_TIMEOUT_S = 0.5


async def context_length_error(settings: ClientSettings) -> InferenceUnavailable:
    client = SGLangClient(settings)
    try:
        with pytest.raises(InferenceUnavailable) as raised:
            await client.context_length()
    finally:
        await client.close()
    return raised.value


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_refused_connection_is_reported_as_refused_not_as_a_timeout() -> None:
    error = asyncio.run(context_length_error(ClientSettings(server_url=f"http://127.0.0.1:{free_port()}")))
    assert "connection refused" in str(error) and "timed out" not in str(error)
    assert error.server_unreachable and error.cause is FailureCause.REFUSED


def test_a_chat_completion_to_a_closed_port_is_refused() -> None:
    async def ask() -> InferenceUnavailable:
        client = SGLangClient(ClientSettings(server_url=f"http://127.0.0.1:{free_port()}"))
        try:
            with pytest.raises(InferenceUnavailable) as raised:
                await client.chat([Message(role="user", content="hi")], SamplingSettings(max_tokens=8), "r")
        finally:
            await client.close()
        return raised.value

    assert asyncio.run(ask()).cause is FailureCause.REFUSED


def test_a_server_that_accepts_but_never_answers_is_reported_as_timed_out(silent_server: str) -> None:
    settings = ClientSettings(server_url=silent_server, request_timeout_s=SHORT_TIMEOUT_S)
    error = asyncio.run(context_length_error(settings))
    assert "timed out" in str(error) and "refused" not in str(error)
    assert error.cause is FailureCause.TIMED_OUT
