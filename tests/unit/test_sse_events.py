"""The stream's events come out whole whatever pieces the bytes arrive in, with any of SSE's line ends,
and a line or an event past its ceiling is refused as malformed instead of growing memory."""

from __future__ import annotations

import pytest

from inference.errors import FailureCause, InferenceUnavailable
from inference.sse import EventReader

CEILING_BYTES = 64
SGLANG_STREAM = (
    b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"choices":[{"delta":{"reasoning_content":"a thought"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)
SGLANG_EVENTS = [
    b'{"choices":[{"delta":{"role":"assistant","content":""}}]}',
    b'{"choices":[{"delta":{"reasoning_content":"a thought"}}]}',
    b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}',
    b"[DONE]",
]


def read(*pieces: bytes, ceiling_bytes: int = 1 << 20) -> list[bytes]:
    reader = EventReader(ceiling_bytes)
    return [event for piece in pieces for event in reader.feed(piece)]


def test_an_sglang_stream_gives_each_event_s_data() -> None:
    assert read(SGLANG_STREAM) == SGLANG_EVENTS


@pytest.mark.parametrize("line_end", [b"\r\n", b"\r"])
def test_every_split_of_the_stream_with_any_line_end_gives_the_same_events(line_end: bytes) -> None:
    stream = SGLANG_STREAM.replace(b"\n", line_end)
    for split in range(len(stream) + 1):
        assert read(stream[:split], stream[split:]) == SGLANG_EVENTS, f"split at byte {split}"
    assert read(*(stream[i : i + 1] for i in range(len(stream)))) == SGLANG_EVENTS


def test_comments_and_other_fields_carry_nothing_and_data_lines_join_with_newlines() -> None:
    stream = (
        b": keep-alive\n\n"
        b'event: message\nid: 7\nretry: 100\ndata: {"a":\ndata:1}\n\n'
        b"data\n\n"
        b"data:no space\n\n"
    )
    assert read(stream) == [b'{"a":\n1}', b"", b"no space"]


def test_an_event_cut_off_before_its_blank_line_is_not_given() -> None:
    assert read(b'data: {"choices":[]}\n', b'data: {"choices":') == []


def test_a_line_past_the_ceiling_is_malformed_even_when_it_comes_in_small_pieces() -> None:
    reader = EventReader(CEILING_BYTES)
    with pytest.raises(InferenceUnavailable, match="past") as raised:
        for _ in range(CEILING_BYTES):
            reader.feed(b"data: xx")
    assert raised.value.cause is FailureCause.MALFORMED


def test_an_event_of_many_short_lines_past_the_ceiling_is_malformed() -> None:
    with pytest.raises(InferenceUnavailable) as raised:
        read(b"data: 0123456789\n" * CEILING_BYTES, ceiling_bytes=CEILING_BYTES)
    assert raised.value.cause is FailureCause.MALFORMED


def test_an_event_up_to_the_ceiling_is_read_however_it_is_split() -> None:
    value = b"x" * (CEILING_BYTES - 1)  # and its newline
    stream = b"data: " + value + b"\n\n"
    for split in range(len(stream) + 1):
        assert read(stream[:split], stream[split:], ceiling_bytes=CEILING_BYTES) == [value]
