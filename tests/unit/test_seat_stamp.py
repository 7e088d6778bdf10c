"""A seat holder's stamp of life tells how long it has been silent only when written on the same Redis
server, by the same holder; a stamp that does not decode tells nothing."""

from __future__ import annotations

import pytest

from workers.recovery.seat_stamp import (
    STAMP_MAX_BYTES,
    ServerView,
    Stamp,
    decode_stamp,
    encode_stamp,
    silent_for_s,
)

HOLDER, SERVER = "a" * 32, "f" * 40


def test_a_stamp_reads_back_as_written() -> None:
    stamp = Stamp(HOLDER, SERVER, 1_796_457_204.975)
    assert decode_stamp(encode_stamp(stamp).encode()) == stamp


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"token-only",
        b"a b not-a-time",
        b"a b 1 extra",
        b"a b " + b"9" * STAMP_MAX_BYTES,
    ],
)
def test_a_stamp_that_does_not_decode_tells_nothing(raw: bytes) -> None:
    assert decode_stamp(raw) is None


def test_a_holder_is_silent_since_its_stamp_on_the_same_server() -> None:
    assert silent_for_s(Stamp(HOLDER, SERVER, 100.0), HOLDER, ServerView(SERVER, 107.5, 3600.0)) == 7.5


@pytest.mark.parametrize(
    ("stamp", "server"),
    [
        (None, SERVER),  # no stamp at all
        (Stamp("b" * 32, SERVER, 100.0), SERVER),  # another holder's
        (Stamp(HOLDER, "e" * 40, 100.0), SERVER),  # written before a restart or a failover
        (Stamp(HOLDER, "", 100.0), ""),  # neither server known (a user that may not ask INFO)
    ],
)
def test_a_stamp_that_cannot_tell_says_so(stamp: Stamp | None, server: str) -> None:
    assert silent_for_s(stamp, HOLDER, ServerView(server, 1_000.0, None)) is None
