"""What a run did to its servers, from the simulators' request logs (`GET /admin/requests`): pure
arithmetic on `RequestRecord`s, so it is checked in CI (tests/unit/test_server_figures.py) without a run.

A request is held by its server from its arrival (`received_at`) to its end (`finished_at`), queued or
decoding. Only the requests that ended "ok" count; a rid is `<run>:<prompt id>:<suffix>`, so the turns
of one conversation share everything before their last `:`.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from inference.simulator import RequestRecord, SimulatorSettings

ARRIVAL, DEPARTURE = 1, -1


def finished(records: Sequence[RequestRecord], run: str) -> list[RequestRecord]:
    """The run's requests that were answered (not the workers' probes, not the failed)."""
    return [
        r for r in records if r.rid.startswith(f"{run}:") and r.status == "ok" and r.finished_at is not None
    ]


def end_of(record: RequestRecord) -> float:
    return record.finished_at if record.finished_at is not None else record.received_at


@dataclass(frozen=True)
class Span:
    """From the first request's arrival at any server to the last one's end."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def span_of(per_server: Sequence[Sequence[RequestRecord]]) -> Span:
    every = [r for records in per_server for r in records]
    return Span(start=min(r.received_at for r in every), end=max(end_of(r) for r in every))


def sending_span_of(per_server: Sequence[Sequence[RequestRecord]]) -> Span:
    """From the first request's arrival to the last one's: while the client still had work to send (the
    drain after it is the longest requests' own length, whoever sends them)."""
    every = [r for records in per_server for r in records]
    return Span(start=min(r.received_at for r in every), end=max(r.received_at for r in every))


def finish_spread_s(per_server: Sequence[Sequence[RequestRecord]]) -> float:
    """How far apart the servers ran out of work: the last end of the last to finish minus the first's."""
    ends = [max(end_of(r) for r in records) for records in per_server if records]
    return max(ends) - min(ends) if ends else 0.0


def request_seconds(per_server: Sequence[Sequence[RequestRecord]]) -> list[float]:
    """Each request's time at its server, arrival to end."""
    return [end_of(r) - r.received_at for records in per_server for r in records]


def held_slot_seconds(records: Sequence[RequestRecord], slots: int, span: Span) -> float:
    """The integral over `span` of min(requests the server holds, slots): slot-seconds kept busy."""
    events = sorted([(r.received_at, ARRIVAL) for r in records] + [(end_of(r), DEPARTURE) for r in records])
    busy = 0.0
    held = 0
    since = span.start
    for at, change in events:
        moment = min(max(at, span.start), span.end)
        busy += min(held, slots) * (moment - since)
        since = moment
        held += change
    return busy


def slots_busy(per_server: Sequence[Sequence[RequestRecord]], slots: int, span: Span | None = None) -> float:
    """The mean over `span` (the run's, from first arrival to last end, by default) of min(requests held,
    slots) ÷ slots, over every server."""
    span = span or span_of(per_server)
    if span.seconds <= 0:
        return 0.0
    busy = sum(held_slot_seconds(records, slots, span) for records in per_server)
    return busy / (slots * len(per_server) * span.seconds)


def turn_gaps(records: Sequence[RequestRecord]) -> list[float]:
    """For each conversation, each turn's arrival minus the end of the turn before it, in seconds."""
    turns: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in records:
        turns[record.rid.rpartition(":")[0]].append(record)
    gaps: list[float] = []
    for conversation in turns.values():
        ordered = sorted(conversation, key=lambda r: r.received_at)
        gaps.extend(later.received_at - end_of(earlier) for earlier, later in itertools.pairwise(ordered))
    return gaps


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (`fraction` in (0, 1]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def describe_gaps(gaps: Sequence[float]) -> str:
    """`n=…, p50=… ms, p99=… ms, max=… ms`."""
    return (
        f"n={len(gaps)} p50={percentile(gaps, 0.5) * 1000:.0f} ms p99={percentile(gaps, 0.99) * 1000:.0f} ms"
        f" max={max(gaps, default=math.nan) * 1000:.0f} ms"
    )


@dataclass(frozen=True)
class Ideal:
    """The least wall time the servers' stated capacity allows for the run's work, split evenly among
    them: decoding every output token with every slot busy, plus prefilling every prompt token the
    server did not find in its prefix cache (the simulator pauses decoding while it prefills). Each
    prefill batch's fixed time is left out: how many batches there are is up to the client. What the
    cache saves depends on the client (a conversation's turns kept on one server find their context
    there), so between clients compare the walls as well: the ideal counts the prefill each one caused."""

    decode_s: float
    prefill_s: float

    @property
    def seconds(self) -> float:
        return self.decode_s + self.prefill_s


def ideal(per_server: Sequence[Sequence[RequestRecord]], settings: SimulatorSettings) -> Ideal:
    every = [r for records in per_server for r in records]
    servers = len(per_server)
    output_tokens = sum(r.completion_tokens for r in every)
    prompt_tokens = sum(r.prompt_tokens - r.cached_tokens for r in every)
    return Ideal(
        decode_s=output_tokens / (settings.capacity_output_tokens_per_wall_s() * servers),
        prefill_s=prompt_tokens * settings.prefill_per_token_s / settings.speedup / servers,
    )
