"""Benchmark the SGLang simulator.

(a) Output tokens/s against client concurrency (1 ... 96) beside the throughput model's prediction:
    it follows the model and saturates at --max-running-requests.
(b) The simulator's own ceiling in requests/s on one core (tiny outputs, a huge speedup, many
    concurrent clients), and its ratio to what the tests and benchmarks need.

Run: .venv/bin/python benchmarks/bench_simulator.py   (about a minute; last line `name=value`)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.simulator import SimulatorProcess, SimulatorSettings

CONCURRENCY_LEVELS = (1, 8, 16, 32, 48, 64, 96)
SWEEP_SPEEDUP = 50.0
SWEEP_OUTPUT_TOKENS = 1000
SWEEP_REQUESTS_PER_CLIENT = 6
CEILING_SPEEDUP = 1_000_000.0
CEILING_OUTPUT_TOKENS = 1
CEILING_CLIENTS = 64
CEILING_DURATION_S = 6.0
# What the project needs from one simulator: the control-plane benchmark wants an instant server
# sustaining 500 completions/s (design.md, "control-plane ceiling").
NEEDED_RPS = 500.0
SERVER_CPU = 0
CLIENT_CPU = 1
REQUEST_TIMEOUT_S = 60.0
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S  # utime + stime


def _body(index: int, max_tokens: int) -> dict[str, object]:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": f"benchmark prompt {index}"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.6,
    }


async def _client(session: aiohttp.ClientSession, url: str, first: int, count: int, max_tokens: int) -> int:
    tokens = 0
    for index in range(first, first + count):
        async with session.post(url, json=_body(index, max_tokens)) as response:
            response.raise_for_status()
            tokens += (await response.json())["usage"]["completion_tokens"]
    return tokens


async def _sweep_level(base_url: str, concurrency: int) -> float:
    """Output tokens per wall second with `concurrency` clients sending back to back."""
    url = base_url + "/chat/completions"
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await _client(session, url, -1, 1, 1)  # warm the connection pool
        started = time.monotonic()
        counts = await asyncio.gather(
            *(
                _client(session, url, client * 1000, SWEEP_REQUESTS_PER_CLIENT, SWEEP_OUTPUT_TOKENS)
                for client in range(concurrency)
            )
        )
        return sum(counts) / (time.monotonic() - started)


def predicted_tokens_per_wall_s(settings: SimulatorSettings, concurrency: int) -> float:
    running = min(concurrency, settings.max_running_requests)
    return running * settings.accept_length / settings.decode_step_s(running) * settings.speedup


def sweep() -> None:
    settings = SimulatorSettings(speedup=SWEEP_SPEEDUP)
    print(
        f"(a) output tokens/s against concurrency: speedup {SWEEP_SPEEDUP:g}, {SWEEP_OUTPUT_TOKENS} tokens "
        f"per request (ignore_eos), max-running-requests {settings.max_running_requests}; figures in model "
        f"time (wall / speedup)"
    )
    print(f"{'concurrency':>11} {'measured tok/s':>15} {'model tok/s':>12} {'ratio':>7}")
    with SimulatorProcess(settings, cpu=SERVER_CPU) as sim:
        for concurrency in CONCURRENCY_LEVELS:
            measured = asyncio.run(_sweep_level(sim.base_url, concurrency)) / SWEEP_SPEEDUP
            model = predicted_tokens_per_wall_s(settings, concurrency) / SWEEP_SPEEDUP
            print(f"{concurrency:>11} {measured:>15.0f} {model:>12.0f} {measured / model:>7.3f}")
    print(
        f"capacity (all {settings.max_running_requests} slots busy): "
        f"{settings.capacity_output_tokens_per_s():.0f} output tokens/s\n"
    )


async def _ceiling_run(base_url: str) -> int:
    url = base_url + "/chat/completions"
    deadline = time.monotonic() + CEILING_DURATION_S
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)

    async def one_client(client: int, session: aiohttp.ClientSession) -> int:
        done = 0
        while time.monotonic() < deadline:
            async with session.post(
                url, json=_body(client * 1_000_000 + done, CEILING_OUTPUT_TOKENS)
            ) as response:
                response.raise_for_status()
                await response.read()
            done += 1
        return done

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return sum(await asyncio.gather(*(one_client(client, session) for client in range(CEILING_CLIENTS))))


def ceiling() -> float:
    settings = SimulatorSettings(speedup=CEILING_SPEEDUP, log_min_interval_wall_s=1.0)
    pinned = shutil.which("taskset") is not None and (os.cpu_count() or 1) > 1
    print(
        f"(b) simulator ceiling: {CEILING_CLIENTS} concurrent clients, "
        f"{CEILING_OUTPUT_TOKENS}-token outputs, speedup {CEILING_SPEEDUP:g}, "
        f"server pinned to CPU {SERVER_CPU}: {pinned}"
    )
    with SimulatorProcess(settings, cpu=SERVER_CPU if pinned else None) as sim:
        cpu_before, started = _cpu_seconds(sim.pid), time.monotonic()
        completed = asyncio.run(_ceiling_run(sim.base_url))
        elapsed = time.monotonic() - started
        server_cpu = (_cpu_seconds(sim.pid) - cpu_before) / elapsed
    measured = completed / elapsed
    ceiling_rps = measured / max(server_cpu, 1e-9) if server_cpu < 1 else measured
    print(f"{'completed':>10} {'seconds':>8} {'req/s':>8} {'server CPU':>11} {'ceiling req/s (1 core)':>23}")
    print(f"{completed:>10} {elapsed:>8.2f} {measured:>8.0f} {server_cpu:>10.0%} {ceiling_rps:>23.0f}")
    print(
        f"needed: {NEEDED_RPS:.0f} req/s (control-plane benchmark's instant server); ratio "
        f"{ceiling_rps / NEEDED_RPS:.1f}x. At speedup K with realistic ~2,300-token outputs and all "
        f"slots busy, one server needs about K req/s."
    )
    return ceiling_rps


def main() -> None:
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {CLIENT_CPU})  # the clients on the other core
    sweep()
    ceiling_rps = ceiling()
    print(f"simulator_ceiling_rps={ceiling_rps:.0f}")


if __name__ == "__main__":
    main()
