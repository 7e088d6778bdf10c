"""Read an SGLang server's `/metrics` (Prometheus text, needs `--enable-metrics`) into a typed snapshot.

What the snapshot carries, and why (SGLang 0.5.23 `observability/metrics_collector.py`, as
docs/simulator.md summarises):
- running and queued requests: the scheduler's gauges `sglang:num_running_reqs` and
  `sglang:num_queue_reqs`, summed over ranks. SGLang refreshes them every decode-log interval, so a
  hung scheduler keeps showing its last value: still "busy", which is what a liveness judge needs.
- the per-step progress counter `sglang:realtime_tokens_total` (label `mode` = decode, prefill_compute,
  prefill_cache): the scheduler adds the tokens of every decode iteration and every prefill batch
  (`scheduler_components/metrics_reporter.py`; only the log line waits for the decode-log interval), so
  it moves many times a second whenever anything decodes. A mode's series appears with its first
  non-zero increment: SGLang's start-up warm-up creates them, and a server that has run no forward pass
  yet has none (`None` then). The simulator exports decode and prefill_compute the same way.
- the completion counters `sglang:generation_tokens_total`, `sglang:num_requests_total` and
  `sglang:spec_verify_calls_total`: incremented when a request finishes, so they stay flat while
  long thinking requests run.
A `priority` label, present only with priority scheduling, splits every series; only its totals
(`priority=""`) are read then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

RUNNING_REQUESTS = "sglang:num_running_reqs"
QUEUED_REQUESTS = "sglang:num_queue_reqs"
REALTIME_TOKENS = "sglang:realtime_tokens_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
REQUESTS = "sglang:num_requests_total"
SPEC_VERIFY_CALLS = "sglang:spec_verify_calls_total"
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
MODE_LABEL = "mode"
DECODE_MODE = "decode"
PRIORITY_LABEL = "priority"
PRIORITY_TOTAL = ""


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape. Counters are cumulative since the server started (a restart resets them)."""

    running_requests: int
    queued_requests: int
    generation_tokens_total: float
    requests_total: float
    decode_tokens_total: float | None = None
    """`realtime_tokens_total{mode="decode"}`; None when the server does not export the per-step counter."""
    prefill_tokens_total: float | None = None
    """`realtime_tokens_total` over the prefill modes; None when not exported."""
    spec_verify_calls_total: float | None = None
    spec_accept_length: float | None = None
    """The server's recent mean accepted tokens per verify pass; None without speculative decoding."""

    @property
    def has_step_counter(self) -> bool:
        """True when progress shows per forward pass, not only when a request finishes."""
        return self.decode_tokens_total is not None

    @property
    def busy(self) -> bool:
        return self.running_requests > 0 or self.queued_requests > 0

    @property
    def progress(self) -> tuple[float, ...]:
        """Every progress counter; any change between two scrapes means the server did work."""
        return (
            self.decode_tokens_total or 0.0,
            self.prefill_tokens_total or 0.0,
            self.generation_tokens_total,
            self.requests_total,
            self.spec_verify_calls_total or 0.0,
        )


def _totals_only(samples: Iterable[Sample]) -> list[Sample]:
    """Drop the per-priority series when priority scheduling splits them; keep their totals."""
    listed = list(samples)
    if any(PRIORITY_LABEL in sample.labels for sample in listed):
        return [s for s in listed if s.labels.get(PRIORITY_LABEL, PRIORITY_TOTAL) == PRIORITY_TOTAL]
    return listed


def parse_metrics(text: str) -> MetricsSnapshot:
    """The snapshot in a Prometheus text exposition; a series the server does not export reads as 0
    (gauges, completion counters) or None (the optional counters)."""
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)

    def total(name: str) -> float:
        return sum(sample.value for sample in _totals_only(samples.get(name, [])))

    def optional_total(name: str) -> float | None:
        return total(name) if name in samples else None

    realtime = _totals_only(samples.get(REALTIME_TOKENS, []))
    decode = [s.value for s in realtime if s.labels.get(MODE_LABEL) == DECODE_MODE]
    prefill = [s.value for s in realtime if s.labels.get(MODE_LABEL) != DECODE_MODE]
    return MetricsSnapshot(
        running_requests=round(total(RUNNING_REQUESTS)),
        queued_requests=round(total(QUEUED_REQUESTS)),
        generation_tokens_total=total(GENERATION_TOKENS),
        requests_total=total(REQUESTS),
        decode_tokens_total=sum(decode) if realtime else None,
        prefill_tokens_total=sum(prefill) if realtime else None,
        spec_verify_calls_total=optional_total(SPEC_VERIFY_CALLS),
        spec_accept_length=samples[SPEC_ACCEPT_LENGTH][0].value if samples.get(SPEC_ACCEPT_LENGTH) else None,
    )
