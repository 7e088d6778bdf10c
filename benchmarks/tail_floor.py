"""What the end of a run costs whoever schedules it: the drain of a run's own requests, replayed offline.

A run ends when its last request does. With output lengths drawn independently of anything a client can
see, no order can know which of the last requests will be long, so part of wall ÷ ideal is the lengths'
own. This replays a run's requests (their output tokens, from the servers' logs) on the simulator's
decode model (a step of `decode_step_s(running)` gives each running request `accept_length` tokens) as
a per-request dispatcher would, which is the best a client can do: every free slot of any GPU takes the
next request at once. Two orders:
  - order-blind: the requests shuffled (the mean over seeded shuffles): any scheduler without a length
    signal, however good, gets this on average;
  - clairvoyant: longest first, knowing every length (the bound no real scheduler reaches).
Both are decode-only, against the ideal's decode part (`Ideal.decode_s`). Pure arithmetic, checked in CI
(tests/unit/test_tail_floor.py).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from inference.simulator import SimulatorSettings

DEFAULT_SHUFFLES = 16
SHUFFLE_SEED = 7


@dataclass
class _Gpu:
    """One server: running requests by the decode step they finish at, and the step count and clock."""

    step: int = 0
    clock_s: float = 0.0
    finishing: list[int] = field(default_factory=list)

    def next_finish_s(self, settings: SimulatorSettings) -> float:
        """When its next request ends: every step until then takes the time of this many running."""
        step_s = settings.decode_step_s(len(self.finishing)) / settings.speedup
        return self.clock_s + (self.finishing[0] - self.step) * step_s


def _steps_for(output_tokens: int, accept_length: float) -> int:
    """Decode steps a request of this many output tokens takes (the first token comes with its prefill)."""
    return max(1, math.ceil((output_tokens - 1) / accept_length))


def drain_wall_s(
    output_tokens: Sequence[int], settings: SimulatorSettings, gpus: int, order: Sequence[int]
) -> float:
    """Wall seconds (at the settings' speedup) to decode these requests in this order (indices into
    `output_tokens`), each free slot of any GPU taking the next at once."""
    slots = settings.max_running_requests
    servers = [_Gpu() for _ in range(gpus)]
    pending = iter(order)
    remaining = len(order)

    def fill(gpu: _Gpu) -> None:
        nonlocal remaining
        while len(gpu.finishing) < slots and remaining:
            heapq.heappush(
                gpu.finishing, gpu.step + _steps_for(output_tokens[next(pending)], settings.accept_length)
            )
            remaining -= 1

    for gpu in servers:
        fill(gpu)
    while busy := [gpu for gpu in servers if gpu.finishing]:
        gpu = min(busy, key=lambda server: server.next_finish_s(settings))
        gpu.clock_s = gpu.next_finish_s(settings)
        gpu.step = gpu.finishing[0]
        while gpu.finishing and gpu.finishing[0] <= gpu.step:
            heapq.heappop(gpu.finishing)
        fill(gpu)
    return max(gpu.clock_s for gpu in servers)


@dataclass(frozen=True)
class TailFloor:
    ideal_decode_s: float
    order_blind_s: float  # mean over the shuffles
    clairvoyant_s: float

    @property
    def order_blind(self) -> float:
        return self.order_blind_s / self.ideal_decode_s

    @property
    def clairvoyant(self) -> float:
        return self.clairvoyant_s / self.ideal_decode_s


def tail_floor(
    output_tokens: Sequence[int],
    settings: SimulatorSettings,
    gpus: int,
    *,
    shuffles: int = DEFAULT_SHUFFLES,
    seed: int = SHUFFLE_SEED,
) -> TailFloor:
    """The decode wall of these requests in random orders (the mean) and longest first, and the ideal."""
    draw = random.Random(seed)
    indices = list(range(len(output_tokens)))
    blind = []
    for _ in range(shuffles):
        draw.shuffle(indices)
        blind.append(drain_wall_s(output_tokens, settings, gpus, indices))
    longest_first = sorted(indices, key=lambda index: output_tokens[index], reverse=True)
    ideal_s = sum(output_tokens) / (settings.capacity_output_tokens_per_wall_s() * gpus)
    return TailFloor(
        ideal_decode_s=ideal_s,
        order_blind_s=sum(blind) / len(blind),
        clairvoyant_s=drain_wall_s(output_tokens, settings, gpus, longest_first),
    )
