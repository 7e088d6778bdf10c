"""`/metrics` with SGLang's metric names, types and labels (`observability/metrics_collector.py`).

Gauges are read from the engine at scrape time, so they show the state at that moment. Counters and
histograms are updated when a request finishes, as SGLang's tokenizer manager does, except
`sglang:realtime_tokens_total`: SGLang's scheduler adds to it on every forward pass
(`scheduler_components/metrics_reporter.py`: `report_decode_stats` every decode iteration with the
tokens it generated, `report_prefill_stats` every prefill batch with its new and cached tokens), so it
moves while requests run. Its series appear with their first non-zero increment (`prefill_cache` with
the first prefix-cache hit). Latencies are wall seconds (what a client observes
at the current speedup).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inference.simulator.engine import Engine, SimRequest
from inference.simulator.settings import SimulatorSettings

ENGINE_TYPE = "unified"
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
REQUEST_LABELS = ("model_name", "engine_type", "is_streaming")
TOKENIZER_LABELS = ("model_name", "engine_type")
CACHE_SOURCE_DEVICE = "device"
LATENCY_BUCKETS_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS_S = (*LATENCY_BUCKETS_S, 600, 1200, 1800, 2400)
INTER_TOKEN_BUCKETS_S = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)


class _SchedulerGauges(Collector):
    """The scheduler's gauges, computed from the engine when scraped."""

    def __init__(self, settings: SimulatorSettings, engine: Engine) -> None:
        self._settings = settings
        self._engine = engine
        self._labels = [settings.model_name, ENGINE_TYPE, "0", "0", "0"]

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(name, documentation, labels=SCHEDULER_LABELS)
        gauge.add_metric(self._labels, value)
        return gauge

    def collect(self) -> Iterator[Metric]:
        engine, settings = self._engine, self._settings
        kv_tokens = engine.kv_tokens()
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", engine.running)
        yield self._gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", engine.queued
        )
        yield self._gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar queue.", 0)
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.", kv_tokens)
        yield self._gauge("sglang:token_usage", "The token usage.", engine.token_usage())
        yield self._gauge(
            "sglang:full_token_usage", "The token usage of the full pool.", engine.token_usage()
        )
        yield self._gauge("sglang:mamba_usage", "The usage of mamba slots.", engine.mamba_usage())
        yield self._gauge("sglang:kv_used_tokens", "KV tokens in use.", kv_tokens)
        yield self._gauge(
            "sglang:kv_available_tokens", "KV tokens available.", settings.max_total_tokens - kv_tokens
        )
        yield self._gauge("sglang:kv_evictable_tokens", "KV tokens evictable.", engine.cached_size_tokens())
        yield self._gauge(
            "sglang:gen_throughput", "The generation throughput (token/s).", engine.gen_throughput
        )
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", engine.cache_hit_rate)
        yield self._gauge(
            "sglang:spec_accept_length",
            "The average acceptance length of speculative decoding.",
            engine.avg_accept_length(),
        )
        yield self._gauge(
            "sglang:spec_accept_rate", "The acceptance rate of speculative decoding.", engine.accept_rate()
        )
        yield self._gauge("sglang:spec_num_steps", "Speculative steps.", settings.speculative_num_steps)
        yield self._gauge(
            "sglang:spec_num_draft_tokens", "Speculative draft tokens.", settings.speculative_num_draft_tokens
        )
        yield self._gauge(
            "sglang:num_retracted_reqs", "The number of retracted requests.", engine.retracted_waiting
        )
        retracted = CounterMetricFamily(
            "sglang:num_retracted_requests", "Total number of retracted requests.", labels=SCHEDULER_LABELS
        )
        retracted.add_metric(self._labels, engine.total_retracted)
        yield retracted
        yield self._gauge(
            "sglang:max_total_num_tokens", "Maximum total tokens in the KV pool.", settings.max_total_tokens
        )
        yield self._gauge("sglang:context_len", "The context length.", settings.context_length)
        yield self._gauge("sglang:page_size", "The page size.", 1)


class _RealtimeTokens(Collector):
    """`sglang:realtime_tokens_total{mode}`, read from the engine's running totals when scraped."""

    def __init__(self, settings: SimulatorSettings, engine: Engine) -> None:
        self._engine = engine
        self._labels = [settings.model_name, ENGINE_TYPE, "0", "0", "0"]

    def collect(self) -> Iterator[Metric]:
        counter = CounterMetricFamily(
            "sglang:realtime_tokens",
            "Total number of tokens processed (updated on each log interval). "
            "mode: prefill_compute, prefill_cache, decode.",
            labels=(*SCHEDULER_LABELS, "mode"),
        )
        for mode, tokens in (
            ("prefill_compute", self._engine.total_prefill_tokens),
            ("prefill_cache", self._engine.total_cached_tokens),
            ("decode", self._engine.total_decode_tokens),
        ):
            if tokens:  # SGLang skips zero increments, so a series first shows with a non-zero value
                counter.add_metric([*self._labels, mode], tokens)
        yield counter


class SimulatorMetrics:
    """A private registry (no global state) with SGLang's counters and histograms."""

    def __init__(self, settings: SimulatorSettings, engine: Engine) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = settings.model_name
        registry = self.registry
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", REQUEST_LABELS, registry=registry
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            REQUEST_LABELS,
            registry=registry,
        )
        self.num_requests = Counter(
            "sglang:num_requests", "The number of requests processed.", REQUEST_LABELS, registry=registry
        )
        self.num_aborted = Counter(
            "sglang:num_aborted_requests", "Number of requests aborted.", TOKENIZER_LABELS, registry=registry
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            (*TOKENIZER_LABELS, "cache_source"),
            registry=registry,
        )
        self.spec_verify_calls = Counter(
            "sglang:spec_verify_calls", "Speculative verify passes.", TOKENIZER_LABELS, registry=registry
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            REQUEST_LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency.",
            REQUEST_LABELS,
            buckets=E2E_BUCKETS_S,
            registry=registry,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency.",
            REQUEST_LABELS,
            buckets=INTER_TOKEN_BUCKETS_S,
            registry=registry,
        )
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            REQUEST_LABELS,
            buckets=INTER_TOKEN_BUCKETS_S,
            registry=registry,
        )
        self.queue_time = Histogram(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            SCHEDULER_LABELS,
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        registry.register(_SchedulerGauges(settings, engine))
        registry.register(_RealtimeTokens(settings, engine))

    def observe_finished(self, request: SimRequest, prompt_tokens: int, completion_tokens: int) -> None:
        """Count a request that ended (finished or aborted), as SGLang does: an abort at once on the
        tokenizer's side, the request's end when the scheduler reports it (not for every abort)."""
        if request.aborted:
            self.num_aborted.labels(self._model, ENGINE_TYPE).inc()
        if not request.reported_finished:
            return
        streaming = "true" if request.streaming else "false"
        labels = (self._model, ENGINE_TYPE, streaming)
        self.prompt_tokens.labels(*labels).inc(prompt_tokens)
        self.generation_tokens.labels(*labels).inc(completion_tokens)
        self.num_requests.labels(*labels).inc()
        self.spec_verify_calls.labels(self._model, ENGINE_TYPE).inc(request.verify_count)
        if request.cached_tokens > 0:  # SGLang's breakdown of a radix-cache hit: all on the device
            self.cached_tokens.labels(self._model, ENGINE_TYPE, CACHE_SOURCE_DEVICE).inc(
                request.cached_tokens
            )
        end = request.finished_wall_s
        if end is None:
            return
        self.e2e.labels(*labels).observe(end - request.arrival_wall_s)
        if request.admitted_wall_s is not None:
            self.queue_time.labels(self._model, ENGINE_TYPE, "0", "0", "0").observe(
                request.admitted_wall_s - request.arrival_wall_s
            )
        if request.first_token_wall_s is not None:
            self.ttft.labels(*labels).observe(request.first_token_wall_s - request.arrival_wall_s)
            if completion_tokens > 1:
                per_token = (end - request.first_token_wall_s) / (completion_tokens - 1)
                self.tpot.labels(*labels).observe(per_token)
                self.itl.labels(*labels).observe(per_token)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
