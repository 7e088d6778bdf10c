"""A TCP forwarder on 127.0.0.1 that can be switched into an outage, for the chaos suite.

    with FaultProxy("127.0.0.1", 9000) as proxy:   # clients use proxy.url instead of :9000
        proxy.outage(True)     # new connections are reset at once, open ones are dropped (RST)
        proxy.outage(False)    # forwarding again

It runs an asyncio server in a daemon thread of its own; the control methods are thread-safe and
return once the change is in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

LOCALHOST = "127.0.0.1"
CHUNK_BYTES = 64 * 1024
CONTROL_TIMEOUT_S = 10.0
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, as a dead peer would


@dataclass
class ProxyStats:
    forwarded: int = 0  # connections accepted and bridged to the upstream
    refused: int = 0  # connections reset at once during an outage (or when the upstream refused)
    dropped: int = 0  # open connections cut when an outage began


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy bytes until end of stream, then half-close the other side."""
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(CHUNK_BYTES):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *, listen_port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = listen_port
        self.stats = ProxyStats()
        self._in_outage = False
        self.first_refused_at: float | None = None  # time.monotonic() of the outage's first refusal
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    @property
    def in_outage(self) -> bool:
        return self._in_outage

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def outage(self, on: bool) -> None:
        """Start (True) or end (False) an outage; starting one drops every open connection."""
        self._call(self._set_outage(on))

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CONTROL_TIMEOUT_S)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, LOCALHOST, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_outage(self, on: bool) -> None:
        self._in_outage = on
        if on:
            self.first_refused_at = None
            self._drop_open_connections()

    def _drop_open_connections(self) -> None:
        for client, upstream in list(self._open):
            _reset(client)
            _reset(upstream)
            self.stats.dropped += 1
        self._open.clear()

    async def _shutdown(self) -> None:
        self._drop_open_connections()
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._in_outage:
            self.stats.refused += 1
            if self.first_refused_at is None:
                self.first_refused_at = time.monotonic()
            _reset(writer)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.stats.refused += 1
            _reset(writer)
            return
        self.stats.forwarded += 1
        pair = (writer, upstream_writer)
        self._open.add(pair)
        try:
            await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))
        finally:
            self._open.discard(pair)
            for side in pair:
                side.close()
