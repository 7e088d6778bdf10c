"""CPU per streamed chunk of the worker's client: the openai client's path (what the worker used before)
beside draftgen's own SSE reader over aiohttp (what it uses now) and the same reader over httpx.

The same prompts against one simulator, a window of concurrent requests as a worker keeps; the paths
take turns in rounds (openai, aiohttp, httpx, openai, ...), each round measured by this process's CPU
time, so that the machine's noise falls on every path alike. The simulator runs pinned to one core and
the clients to the other. Prints µs of CPU per chunk and the share of a core a worker would use at
650 chunks/s (one GPU at the seeds' 2,300 tokens/s, MTP's ~3.5 tokens per chunk).

Run: .venv/bin/python benchmarks/bench_stream.py [--prompts 480] [--rounds 2] [--speedup 20]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.records import Message, SamplingSettings
from inference.chat_stream import MAX_EVENT_BYTES, StreamAssembly
from inference.client import DONE, SGLangClient, build_request, request_body
from inference.client_settings import ClientSettings
from inference.simulator import SimulatorProcess, SimulatorSettings
from inference.sse import EventReader

WINDOW = 48  # requests in flight, as a worker keeps for its server's 48 slots
REAL_CHUNKS_PER_S = 650  # one GPU at the seeds' rate: 2,300 tokens/s in chunks of ~3.5 tokens (MTP)
SAMPLING = SamplingSettings(max_tokens=4096)
REQUEST_TIMEOUT_S = 600.0
SERVER_CPU = 0
CLIENT_CPU = 1
MICROSECONDS_PER_S = 1e6

Ask = Callable[[list[Message], str, Callable[[], None]], Awaitable[None]]


@dataclasses.dataclass
class Tally:
    chunks: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0

    @property
    def us_per_chunk(self) -> float:
        return self.cpu_s / max(self.chunks, 1) * MICROSECONDS_PER_S


class OpenAIPath:
    """The worker's path before: the openai client (aiohttp underneath) and its pydantic chunks, with
    the per-chunk work its assembly did (the SGLang extras read from `model_extra`)."""

    def __init__(self, base_url: str) -> None:
        self._client = openai.AsyncOpenAI(
            base_url=base_url + "/v1",
            api_key="EMPTY",
            max_retries=0,
            timeout=REQUEST_TIMEOUT_S,
            http_client=openai.DefaultAioHttpClient(timeout=REQUEST_TIMEOUT_S),
        )

    async def ask(self, messages: list[Message], rid: str, on_chunk: Callable[[], None]) -> None:
        content: list[str] = []
        stream = await self._client.chat.completions.create(**build_request(messages, SAMPLING, rid))
        async with stream:
            async for chunk in stream:
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta.content:
                        content.append(delta.content)
                    reasoning = (delta.model_extra or {}).get("reasoning_content")
                    if reasoning:
                        content.append(reasoning)
                (chunk.model_extra or {}).get("sglext")
                on_chunk()

    async def close(self) -> None:
        await self._client.close()


class AiohttpPath:
    """The worker's path now: `SGLangClient.chat`."""

    def __init__(self, base_url: str) -> None:
        self._client = SGLangClient(ClientSettings(server_url=base_url, request_timeout_s=REQUEST_TIMEOUT_S))

    async def ask(self, messages: list[Message], rid: str, on_chunk: Callable[[], None]) -> None:
        await self._client.chat(messages, SAMPLING, rid, on_chunk)

    async def close(self) -> None:
        await self._client.close()


class HttpxPath:
    """The same reader and assembly over httpx's own connection pool, for the choice of transport."""

    def __init__(self, base_url: str) -> None:
        limits = httpx.Limits(max_connections=WINDOW, max_keepalive_connections=WINDOW)
        self._client = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits)
        self._url = base_url + "/v1/chat/completions"

    async def ask(self, messages: list[Message], rid: str, on_chunk: Callable[[], None]) -> None:
        assembly = StreamAssembly()
        events = EventReader(MAX_EVENT_BYTES)
        body = request_body(messages, SAMPLING, rid)
        headers = {"content-type": "application/json"}
        async with self._client.stream("POST", self._url, content=body, headers=headers) as response:
            response.raise_for_status()
            async for piece in response.aiter_raw():
                for data in events.feed(piece):
                    if data.startswith(DONE):
                        break
                    assembly.add_event(data)
                    on_chunk()
        assembly.result(started_at=0.0, finished_at=0.0)

    async def close(self) -> None:
        await self._client.aclose()


PATHS: dict[str, Callable[[str], Any]] = {"openai": OpenAIPath, "aiohttp": AiohttpPath, "httpx": HttpxPath}


async def one_round(path: Any, prompts: list[str], tag: str) -> Tally:
    tally = Tally()
    window = asyncio.Semaphore(WINDOW)

    def counted() -> None:
        tally.chunks += 1

    async def one(index: int, text: str) -> None:
        async with window:
            await path.ask([Message(role="user", content=text)], f"{tag}:{index}", counted)

    # warm the connection pool and the imports before the clock starts
    await path.ask([Message(role="user", content="warm up")], f"{tag}:warm", lambda: None)
    cpu_before, wall_before = time.process_time(), time.monotonic()
    await asyncio.gather(*(one(index, text) for index, text in enumerate(prompts)))
    tally.cpu_s = time.process_time() - cpu_before
    tally.wall_s = time.monotonic() - wall_before
    await path.close()
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=480, help="requests per path and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--speedup", type=float, default=20.0)
    parser.add_argument("--paths", default="openai,aiohttp,httpx")
    args = parser.parse_args()
    names = args.paths.split(",")
    pinned = shutil.which("taskset") is not None and (os.cpu_count() or 1) > 1
    if pinned:
        os.sched_setaffinity(0, {CLIENT_CPU})
    prompts = [f"stream benchmark prompt {index}" for index in range(args.prompts)]
    settings = SimulatorSettings(speedup=args.speedup, max_running_requests=WINDOW)
    tallies = {name: Tally() for name in names}
    print(
        f"{args.prompts} prompts per path and round, {args.rounds} rounds, window {WINDOW}, simulator "
        f"speedup {args.speedup:g} (default length mix), pinned (server CPU {SERVER_CPU}, clients CPU "
        f"{CLIENT_CPU}): {pinned}"
    )
    print(
        f"{'round':>5} {'path':>8} {'chunks':>8} {'wall s':>7} {'chunks/s':>9} {'CPU s':>7} {'µs/chunk':>9}"
    )
    with SimulatorProcess(settings, cpu=SERVER_CPU if pinned else None) as sim:
        for round_number in range(1, args.rounds + 1):
            for name in names:
                tally = asyncio.run(one_round(PATHS[name](sim.url), prompts, f"{name}{round_number}"))
                print(
                    f"{round_number:>5} {name:>8} {tally.chunks:>8} {tally.wall_s:>7.1f} "
                    f"{tally.chunks / tally.wall_s:>9.0f} {tally.cpu_s:>7.2f} {tally.us_per_chunk:>9.1f}"
                )
                total = tallies[name]
                total.chunks += tally.chunks
                total.cpu_s += tally.cpu_s
                total.wall_s += tally.wall_s
    print(f"\n{'path':>8} {'µs/chunk':>9} {f'core at {REAL_CHUNKS_PER_S}/s':>16} {'÷ openai':>9}")
    baseline = tallies.get("openai")
    for name, total in tallies.items():
        share = total.us_per_chunk * REAL_CHUNKS_PER_S / MICROSECONDS_PER_S
        ratio = f"{total.us_per_chunk / baseline.us_per_chunk:.2f}" if baseline else "-"
        print(f"{name:>8} {total.us_per_chunk:>9.1f} {share:>16.3f} {ratio:>9}")
    print(" ".join(f"{name}_us_per_chunk={total.us_per_chunk:.1f}" for name, total in tallies.items()))


if __name__ == "__main__":
    main()
