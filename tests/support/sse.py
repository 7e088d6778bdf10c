"""A fake server for the client's tests: real HTTP on a local port, answering with the frames SGLang
streams, written as the test says (in pieces, cut off, or as an error status), and keeping each request."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DONE = "[DONE]"
LAST_CHUNK = b"0\r\n\r\n"


def chunk(
    delta: dict[str, Any] | None = None, *, finish_reason: str | None = None, **top: Any
) -> dict[str, Any]:
    """A `chat.completion.chunk`: one choice with `delta` (and `finish_reason`), or `choices: []` with
    `top`'s keys (`usage`, `sglext`) when `delta` is None."""
    choices = (
        []
        if delta is None
        else [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": None,
            }
        ]
    )
    return {
        "id": "r1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "default",
        "choices": choices,
        **top,
    }


def event_body(*events: dict[str, Any] | str) -> bytes:
    """`data:` events as SGLang frames them (a string is sent as it is, e.g. DONE)."""
    return "".join(
        f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n" for event in events
    ).encode()


@dataclass(frozen=True)
class Answer:
    """What the fake server answers: `pieces` written (and flushed) one by one in HTTP chunks; `cut` closes
    the connection after them, before the stream's end."""

    status: int = 200
    pieces: tuple[bytes, ...] = ()
    content_type: str = "text/event-stream"
    cut: bool = False


def event_stream(*events: dict[str, Any] | str) -> Answer:
    """A 200 `text/event-stream` answer made of `data:` events."""
    return Answer(pieces=(event_body(*events),))


def json_answer(status: int, body: object) -> Answer:
    return Answer(status=status, pieces=(json.dumps(body).encode(),), content_type="application/json")


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass
class FakeServer:
    url: str
    requests: list[Seen] = field(default_factory=list)


@contextlib.contextmanager
def serving(answer: Answer | Callable[[Seen], Answer]) -> Iterator[FakeServer]:
    """A server on a free local port answering every request with `answer` (or what it returns)."""
    seen: list[Seen] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            request = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            seen.append(request)
            reply = answer(request) if callable(answer) else answer
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in reply.pieces:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            if reply.cut:
                self.close_connection = True
                return
            self.wfile.write(LAST_CHUNK)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeServer(f"http://127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
