"""Server-sent events from the bytes of a stream as they arrive: the data of each event, bounded.

The WHATWG rules that matter to a chat stream: lines end with `\\r\\n`, `\\n` or `\\r`; a blank line ends
an event; `data:` lines (one space after the colon dropped) are joined with `\\n`; comments (`:`) and the
other fields (`event`, `id`, `retry`) carry nothing a completion needs. A line or an event past
`max_event_bytes` is no answer a server makes: InferenceUnavailable (MALFORMED), never memory growth.
"""

from __future__ import annotations

from inference.errors import FailureCause, InferenceUnavailable

DATA_FIELD = b"data"
DATA_PREFIX = b"data:"
LF = b"\n"
CR = b"\r"
CRLF = b"\r\n"
SPACE = b" "
NO_EVENTS: list[bytes] = []


class EventReader:
    """Feed it the stream's bytes in any pieces; it returns the data of each event a piece completes."""

    def __init__(self, max_event_bytes: int) -> None:
        self._max_event_bytes = max_event_bytes
        self._max_line_bytes = max_event_bytes + len(DATA_PREFIX) + len(SPACE)  # its data, with the field
        self._line = bytearray()  # the unfinished last line
        self._data: list[bytes] = []  # the data lines of the event being read
        self._data_bytes = 0
        self._after_cr = False  # the last piece ended with \r: a \n first in the next one is its pair

    def feed(self, piece: bytes) -> list[bytes]:
        if CR in piece or self._after_cr:
            piece = self._newlines_only(piece)
        if LF not in piece:
            self._line += piece
            self._check(len(self._line), self._max_line_bytes)
            return NO_EVENTS
        if self._line:
            self._line += piece
            piece = bytes(self._line)
            self._line.clear()
        lines = piece.split(LF)
        last = lines.pop()
        self._line += last
        self._check(len(last), self._max_line_bytes)
        events: list[bytes] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(LF.join(self._data))
                    self._data = []
                    self._data_bytes = 0
            elif line.startswith(DATA_PREFIX):
                self._add_data(line[6:] if line[5:6] == SPACE else line[5:])
            elif line == DATA_FIELD:
                self._add_data(b"")
            # else a comment (`:`) or another field: nothing a completion needs
        return events

    def _add_data(self, value: bytes) -> None:
        self._data.append(value)
        self._data_bytes += len(value) + 1
        self._check(self._data_bytes, self._max_event_bytes)

    def _newlines_only(self, piece: bytes) -> bytes:
        if not piece:
            return piece
        if self._after_cr and piece.startswith(LF):
            piece = piece[1:]
        self._after_cr = piece.endswith(CR)
        return piece.replace(CRLF, LF).replace(CR, LF)

    def _check(self, size: int, ceiling_bytes: int) -> None:
        if size > ceiling_bytes:
            raise InferenceUnavailable(
                f"a line or event of the stream is past {ceiling_bytes} bytes: no answer a server makes",
                cause=FailureCause.MALFORMED,
            )
