"""`python -m producer metrics`: a Prometheus exporter reading Redis on every scrape.

A custom collector, so nothing is cached between scrapes: each scrape gathers the same figures as
`status` (producer/status/) for every run (or those given), plus the queues and the per-GPU
heartbeats, which are global. Counters are the runs' running totals, so Grafana takes rates with
`rate()`; the per-GPU token rate is a gauge over the last minute (it comes from the event stream).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from core.exit_codes import EXIT_OK
from producer.errors import RunNotFound, RunStateBroken, SettingsError
from producer.settings import ProducerSettings
from producer.status.gather import gather_status, queue_depths
from producer.status.model import RunStatus
from workers.broker.parked_messages import parked_counts
from workers.state.heartbeats import read_heartbeats
from workers.state.keys import RUNS_KEY, RunKeys, check_run_name
from workers.state.redis_client import client_for
from workers.state.stats_fields import (
    COMPLETION_TOKENS,
    COMPLETIONS,
    DEAD_PREFIX,
    FINISH_PREFIX,
    PROMPT_TOKENS,
    QUALITY_PREFIX,
    REASONING_TOKENS,
    parse_counters,
)

log = logging.getLogger(__name__)

HEALTHY_STATUS = 200
PREFIX = "draftgen_"


class _Families:
    """Metric families of one scrape, created on first use, yielded in creation order."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def counter(self, name: str, documentation: str, labels: Sequence[str]) -> CounterMetricFamily:
        family = self._families.setdefault(
            name, CounterMetricFamily(PREFIX + name, documentation, labels=list(labels))
        )
        assert isinstance(family, CounterMetricFamily)
        return family

    def gauge(self, name: str, documentation: str, labels: Sequence[str]) -> GaugeMetricFamily:
        family = self._families.setdefault(
            name, GaugeMetricFamily(PREFIX + name, documentation, labels=list(labels))
        )
        assert isinstance(family, GaugeMetricFamily)
        return family

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def add_run(families: _Families, status: RunStatus, counters: dict[str, int]) -> None:
    """A run's figures, labelled `run` (and `gpu`, `quality`, `finish_reason`, `reason`)."""
    run = [status.run]
    progress = status.progress
    for name, value, doc in (
        ("prompts_enqueued", progress.enqueued, "Prompts accepted into the run."),
        ("prompts_committed", progress.committed, "Prompts in a committed object (listed in the manifest)."),
        ("prompts_dead_lettered", progress.dead_lettered, "Prompts that will get no completion."),
        ("rows_rejected", progress.rejected_rows, "Input rows refused at enqueue."),
        ("completions", counters.get(COMPLETIONS, 0), "Completions generated (staged)."),
        (
            "output_tokens",
            counters.get(COMPLETION_TOKENS, 0),
            "Output tokens generated, thinking included.",
        ),
        ("reasoning_tokens", counters.get(REASONING_TOKENS, 0), "Thinking tokens generated."),
        ("prompt_tokens", counters.get(PROMPT_TOKENS, 0), "Prompt tokens of the completions."),
        ("objects_committed", status.upload.objects_committed, "Objects listed in the run's manifest."),
        ("committed_bytes", status.upload.committed_bytes, "Bytes of the committed objects."),
    ):
        families.counter(name, doc, ["run"]).add_metric(run, value)
    gauges: tuple[tuple[str, float, str], ...] = (
        ("prompts_staged", progress.staged, "Completions generated and awaiting upload."),
        ("prompts_remaining", progress.remaining, "Prompts still to generate."),
        ("upload_backlog_bytes", status.upload.staged_bytes, "Bytes of the completions awaiting upload."),
        ("run_paused", int(status.paused is not None), "1 while the run is paused (by hand or the gate)."),
        (
            "output_tokens_per_second",
            status.throughput.last_minute.output_tokens_per_s,
            "Output tokens per second over the last minute.",
        ),
        (
            "completions_per_second",
            status.throughput.last_minute.completions_per_s,
            "Completions per second over the last minute.",
        ),
    )
    for gauge_name, gauge_value, gauge_doc in gauges:
        families.gauge(gauge_name, gauge_doc, ["run"]).add_metric(run, gauge_value)
    eta = families.gauge(
        "run_eta_seconds", "Seconds until every prompt is generated (absent: unknown).", ["run"]
    )
    if status.eta.seconds is not None:
        eta.add_metric(run, status.eta.seconds)
    oldest = families.gauge(
        "upload_oldest_staged_age_seconds", "Age of the oldest completion awaiting upload.", ["run"]
    )
    if status.upload.oldest_staged_age_s is not None:
        oldest.add_metric(run, status.upload.oldest_staged_age_s)
    _labelled_counters(families, status.run, counters)
    _quarantine(families, status)
    per_gpu = families.gauge(
        "gpu_output_tokens_per_second",
        "The run's output tokens per second per GPU, last minute.",
        ["run", "gpu"],
    )
    for row in status.gpus:
        per_gpu.add_metric([status.run, row.worker], row.output_tokens_per_s)


def _labelled_counters(families: _Families, run: str, counters: dict[str, int]) -> None:
    for prefix, name, label, doc in (
        (QUALITY_PREFIX, "completions_by_quality", "quality", "Completions by quality label."),
        (FINISH_PREFIX, "completions_by_finish_reason", "finish_reason", "Completions by finish reason."),
        (DEAD_PREFIX, "dead_letters", "reason", "Dead-lettered prompts by reason."),
    ):
        family = families.counter(name, doc, ["run", label])
        for key, value in sorted(counters.items()):
            if key.startswith(prefix):
                family.add_metric([run, key.removeprefix(prefix)], value)


def _quarantine(families: _Families, status: RunStatus) -> None:
    quarantine = status.quarantine
    records = families.gauge(
        "records_quarantined", "Records read back from Redis that could not be trusted, kept apart.", ["run"]
    )
    records.add_metric([status.run], quarantine.records if quarantine else 0)
    awaiting = families.gauge(
        "prompts_awaiting_regeneration",
        "Real prompts of quarantined records not generated again yet.",
        ["run"],
    )
    awaiting.add_metric([status.run], quarantine.awaiting_regeneration if quarantine else 0)
    by_reason = families.gauge(
        "records_quarantined_by_reason", "Quarantined records by reason (over those read).", ["run", "reason"]
    )
    for reason, count in (quarantine.reasons if quarantine else {}).items():
        by_reason.add_metric([status.run, reason], count)


def add_fleet(families: _Families, client: redis.Redis) -> None:
    """Queues and GPUs: shared by every run."""
    waiting = families.gauge("queue_waiting_messages", "Messages waiting in the queue (LLEN).", ["queue"])
    in_flight = families.gauge(
        "queue_in_flight_messages", "Messages delivered to a worker and not yet acknowledged.", ["queue"]
    )
    for depth in queue_depths(client):
        waiting.add_metric([depth.queue], depth.waiting)
        in_flight.add_metric([depth.queue], depth.in_flight)
    parked = families.counter(
        "parked_messages",
        "Malformed messages parked instead of delivered, by queue and reason.",
        ["queue", "reason"],
    )
    for count in parked_counts(client):
        parked.add_metric([count.queue, count.reason], count.count)
    now = time.time()
    gpu_families = {
        "in_flight": families.gauge("gpu_in_flight_requests", "Requests at the GPU's server.", ["gpu"]),
        "max_in_flight": families.gauge(
            "gpu_max_in_flight_requests", "The worker's in-flight window.", ["gpu"]
        ),
        "accept": families.gauge(
            "gpu_spec_accept_length_tokens", "Speculative decoding: tokens accepted per verify step.", ["gpu"]
        ),
        "healthy": families.gauge("gpu_server_healthy", "1 when the server's /health answered 200.", ["gpu"]),
        "suspended": families.gauge(
            "gpu_suspended", "1 while the worker stopped sending (server hung).", ["gpu"]
        ),
        "age": families.gauge(
            "gpu_heartbeat_age_seconds", "Seconds since the worker's last heartbeat.", ["gpu"]
        ),
    }
    for beat in read_heartbeats(client):
        label = [beat.worker]
        gpu_families["in_flight"].add_metric(label, beat.in_flight)
        gpu_families["max_in_flight"].add_metric(label, beat.max_in_flight)
        if beat.spec_accept_length is not None:
            gpu_families["accept"].add_metric(label, beat.spec_accept_length)
        gpu_families["healthy"].add_metric(label, int(beat.server_health == HEALTHY_STATUS))
        gpu_families["suspended"].add_metric(label, int(beat.suspended))
        gpu_families["age"].add_metric(label, max(0.0, now - beat.updated_at))


class DraftgenCollector(Collector):
    """Reads Redis on every scrape; `draftgen_redis_up` says whether it could."""

    def __init__(self, client: redis.Redis, runs: Callable[[], list[str]]) -> None:
        self._client = client
        self._runs = runs

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        up = GaugeMetricFamily(PREFIX + "redis_up", "1 when the last scrape could read Redis.")
        try:
            add_fleet(families, self._client)
            for run in self._runs():
                try:
                    status = gather_status(self._client, run)
                except RunNotFound:
                    continue  # listed but never pinned, or removed
                except RunStateBroken as error:  # one unreadable run does not blind the others
                    log.warning("run %s left out: %s", run, error)
                    continue
                counters = parse_counters(self._client.hgetall(RunKeys(run).stats))
                add_run(families, status, counters)
        except redis.RedisError:
            log.warning("scrape could not read Redis", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families


def run_names(client: redis.Redis, chosen: Sequence[str] | None) -> Callable[[], list[str]]:
    """The runs to export: those given, else every run in Redis (read again on each scrape)."""
    if chosen:
        names = [check_run_name(run) for run in chosen]
        return lambda: names
    return lambda: sorted(raw.decode() for raw in client.smembers(RUNS_KEY))


def serve(client: redis.Redis, runs: Sequence[str] | None, *, address: str, port: int) -> Any:
    """Start the exporter's HTTP server on a daemon thread; returns the server (call `.shutdown()`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DraftgenCollector(client, run_names(client, runs)))
    server, _thread = start_http_server(port, addr=address, registry=registry)
    return server


def _is_loopback(address: str) -> bool:
    """Whether every address the name stands for is this machine's loopback (IPv4 or IPv6)."""
    try:
        found = socket.getaddrinfo(address, None)
    except (socket.gaierror, UnicodeError) as error:
        raise SettingsError(f"--address {address}: not an address of this machine ({error})") from error
    return all(ipaddress.ip_address(str(entry[4][0]).split("%")[0]).is_loopback for entry in found)


def cmd_metrics(args: argparse.Namespace, settings: ProducerSettings) -> int:
    client = client_for(args.redis_url or settings.redis_url)
    if not _is_loopback(args.address):
        print(
            f"warning: {args.address} is reachable beyond this machine and the endpoint has no "
            "authentication: anyone who can reach it reads every run's names, rates and costs",
            file=sys.stderr,
            flush=True,
        )
    try:
        server = serve(client, args.runs, address=args.address, port=args.port)
    except OSError as error:
        raise SettingsError(
            f"--address {args.address} --port {args.port}: cannot listen there: {error}"
        ) from error
    port = server.server_address[1]  # the port bound, also when --port 0 asked for any free one
    host = f"[{args.address}]" if ":" in args.address else args.address  # an IPv6 address in a URL
    print(f"serving draftgen metrics on http://{host}:{port}/metrics (Ctrl-C stops)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return EXIT_OK
