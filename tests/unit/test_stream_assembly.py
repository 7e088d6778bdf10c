"""A stream adds up to no more text than a context holds: past it the answer is malformed, not memory."""

from __future__ import annotations

import pytest

from inference.chat_stream import StreamAssembly
from inference.errors import FailureCause, InferenceUnavailable

CEILING_CHARS = 10


def test_text_past_the_ceiling_is_malformed_reasoning_and_answer_together() -> None:
    assembly = StreamAssembly(max_text_chars=CEILING_CHARS)
    assembly.add_event(b'{"choices":[{"delta":{"reasoning_content":"12345"}}]}')
    assembly.add_event(b'{"choices":[{"delta":{"content":"12345"}}]}')
    with pytest.raises(InferenceUnavailable, match="past 10 characters") as raised:
        assembly.add_event(b'{"choices":[{"delta":{"content":"!"}}]}')
    assert raised.value.cause is FailureCause.MALFORMED


def test_a_chunk_of_the_wrong_shape_is_malformed() -> None:
    with pytest.raises(InferenceUnavailable) as raised:
        StreamAssembly().add_event(b'{"choices":[{"delta":{"content":5}}]}')
    assert raised.value.cause is FailureCause.MALFORMED


def test_extras_of_an_unexpected_shape_leave_the_result_without_them() -> None:
    assembly = StreamAssembly()
    assembly.add_event(b'{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}')
    assembly.add_event(
        b'{"choices":[],"sglext":{"input_ids":[1,true],"output_ids":"x","spec_tokens_details":[7]}}'
    )
    assembly.add_event(b'{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}')
    result = assembly.result(started_at=0.0, finished_at=0.0)
    assert (result.content, result.prompt_token_ids, result.response_token_ids) == ("a", None, None)
    assert result.spec_accept_length is None and result.usage.reasoning_tokens == 0


@pytest.mark.parametrize("ids", ["[1,-2]", "[1,2147483648]"])
def test_token_ids_no_vocabulary_holds_leave_the_result_without_them(ids: str) -> None:
    assembly = StreamAssembly()
    assembly.add_event(b'{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}')
    assembly.add_event(b'{"choices":[],"sglext":{"input_ids":%s,"output_ids":[[3]]}}' % ids.encode())
    assembly.add_event(b'{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}')
    result = assembly.result(started_at=0.0, finished_at=0.0)
    assert (result.prompt_token_ids, result.response_token_ids) == (None, [3])
