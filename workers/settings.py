"""Typed settings for the worker processes, read from `DRAFTGEN_*` environment variables once, at the edge."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from inference.client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S, ClientSettings
from workers.leases import DEFAULT_LEASE_RENEW_S, DEFAULT_LEASE_TTL_S
from workers.reconciler import DEFAULT_RECONCILE_INTERVAL_S, DEFAULT_STRANDED_GRACE_S, ReconcileSettings
from workers.request_deadline import DEFAULT_DEADLINE_FACTOR, DEFAULT_DEADLINE_SLACK_S, DeadlinePolicy

ENV_PREFIX = "DRAFTGEN_"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SERVER_HOST = "127.0.0.1"
DEFAULT_BASE_PORT = 30000  # SGLang's default port; GPU i listens on base + i
DEFAULT_MAX_IN_FLIGHT = 48  # requests kept at the server: its --max-running-requests
DEFAULT_MAX_ATTEMPTS = 3
# Batches held at once. A batch lives as long as its slowest prompt, and several held batches can be
# in their tails together: hold ~5 windows of prompts (8 x 32 for 48 slots) so the window never starves.
# Measured (benchmarks/bench_pipeline.py): 3 x 32 kept 0.80 of capacity, 6 x 32 kept 0.999.
DEFAULT_BATCHES_IN_FLIGHT = 8
DEFAULT_VISIBILITY_TIMEOUT_S = 7200  # a backstop above any batch's lifetime; see README "Failures"
DEFAULT_UNACKED_RESTORE_INTERVAL_S = 10
DEFAULT_UPLOAD_MAX_COMPLETIONS = 1000
DEFAULT_UPLOAD_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_UPLOAD_MAX_AGE_S = 60.0
# Lease of a run's flush lock, renewed before each part. An uploader killed mid-flush holds it until it
# expires, so it is short: one part (at most 64 MB to S3) takes seconds.
DEFAULT_UPLOAD_LOCK_S = 60.0
DEFAULT_BACKOFF_BASE_S = 1.0
DEFAULT_BACKOFF_CAP_S = 60.0
DEFAULT_SERVER_DOWN_RETRY_S = 30.0  # how soon a batch refused for an unreachable server comes back
DEFAULT_LIVENESS_POLL_S = 5.0  # one /metrics scrape: milliseconds of the server's HTTP process
# Liveness (docs/liveness.md): a server with requests running and no token progress for this long is hung.
# SGLang 0.5.23 counts decode tokens per forward pass (realtime_tokens_total): with anything running it
# moves every few seconds. 300 s is far above that, above a 40k-token prefill or a first batch's warm-up,
# and a real hang costs at most 5 minutes of one GPU; a false alarm costs up to 48 abandoned requests.
DEFAULT_LIVENESS_STALL_S = 300.0
# A server exporting only completion counters (the simulator, older SGLang) shows progress only when a
# request finishes. With 48 running they finish about once a second, but a run's first 48 requests start
# together, and if all think long (40,960-token context at ~48 tokens/s each: ~14 min) none finishes for
# minutes. The window must exceed the longest legitimate request, and the client's own 1200 s timeout.
DEFAULT_LIVENESS_COMPLETION_STALL_S = 1500.0
# On SIGTERM (systemctl stop, a spot notice: AWS gives 120 s, GCP 30 s) requests in flight get this long
# to finish; the rest of the held batches go back to the queue at once.
DEFAULT_SHUTDOWN_GRACE_S = 25.0


_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def _redact_url(url: str) -> str:
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


@dataclass(frozen=True)
class UploadSettings:
    max_completions: int = DEFAULT_UPLOAD_MAX_COMPLETIONS
    max_bytes: int = DEFAULT_UPLOAD_MAX_BYTES
    max_age_s: float = DEFAULT_UPLOAD_MAX_AGE_S
    lock_s: float = DEFAULT_UPLOAD_LOCK_S


@dataclass(frozen=True)
class WorkerSettings:
    redis_url: str = DEFAULT_REDIS_URL
    server_url: str = f"http://{DEFAULT_SERVER_HOST}:{DEFAULT_BASE_PORT}"
    gpu: int | None = None
    api_key: str | None = None
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    batches_in_flight: int = DEFAULT_BATCHES_IN_FLIGHT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S
    backoff_cap_s: float = DEFAULT_BACKOFF_CAP_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    server_down_retry_s: float = DEFAULT_SERVER_DOWN_RETRY_S
    visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S
    unacked_restore_interval_s: int = DEFAULT_UNACKED_RESTORE_INTERVAL_S
    hostname: str = field(default_factory=socket.gethostname)
    upload: UploadSettings = field(default_factory=UploadSettings)
    liveness_enabled: bool = True
    liveness_poll_s: float = DEFAULT_LIVENESS_POLL_S
    liveness_stall_s: float = DEFAULT_LIVENESS_STALL_S
    liveness_completion_stall_s: float = DEFAULT_LIVENESS_COMPLETION_STALL_S
    server_restart_command: str | None = None  # e.g. "systemctl restart draftgen-sglang@0"; run on a hang
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    lease_renew_s: float = DEFAULT_LEASE_RENEW_S
    reconcile_interval_s: float = DEFAULT_RECONCILE_INTERVAL_S
    stranded_grace_s: float = DEFAULT_STRANDED_GRACE_S
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    request_deadline_factor: float = DEFAULT_DEADLINE_FACTOR
    request_deadline_slack_s: float = DEFAULT_DEADLINE_SLACK_S

    def client_settings(self) -> ClientSettings:
        return ClientSettings(
            server_url=self.server_url,
            api_key=self.api_key,
            request_timeout_s=self.request_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            max_connections=self.max_in_flight * 2,
        )

    def deadline_policy(self) -> DeadlinePolicy:
        return DeadlinePolicy(factor=self.request_deadline_factor, slack_s=self.request_deadline_slack_s)

    def reconcile_settings(self) -> ReconcileSettings:
        return ReconcileSettings(
            upload_max_age_s=self.upload.max_age_s,
            interval_s=self.reconcile_interval_s,
            stranded_grace_s=self.stranded_grace_s,
        )

    def __repr__(self) -> str:
        return (
            f"WorkerSettings(redis_url={_redact_url(self.redis_url)!r}, server_url={self.server_url!r}, "
            f"gpu={self.gpu}, api_key={'***' if self.api_key else None}, max_in_flight={self.max_in_flight}, "
            f"max_attempts={self.max_attempts}, visibility_timeout_s={self.visibility_timeout_s})"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSettings:
        """Build from `DRAFTGEN_*` variables. The server is DRAFTGEN_SERVER_URL, or GPU index + base port."""
        source = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = source.get(ENV_PREFIX + name)
            return value if value not in (None, "") else None

        gpu_text = get("GPU")
        gpu = int(gpu_text) if gpu_text is not None else None
        server_url = get("SERVER_URL")
        if server_url is None:
            host = get("SERVER_HOST") or DEFAULT_SERVER_HOST
            port = int(get("BASE_PORT") or DEFAULT_BASE_PORT) + (gpu or 0)
            server_url = f"http://{host}:{port}"
        defaults = cls()
        upload_defaults = UploadSettings()
        return cls(
            redis_url=get("REDIS_URL") or DEFAULT_REDIS_URL,
            server_url=server_url,
            gpu=gpu,
            api_key=get("API_KEY"),
            max_in_flight=int(get("MAX_IN_FLIGHT") or defaults.max_in_flight),
            batches_in_flight=int(get("BATCHES_IN_FLIGHT") or defaults.batches_in_flight),
            max_attempts=int(get("MAX_ATTEMPTS") or defaults.max_attempts),
            backoff_base_s=float(get("BACKOFF_BASE_S") or defaults.backoff_base_s),
            backoff_cap_s=float(get("BACKOFF_CAP_S") or defaults.backoff_cap_s),
            request_timeout_s=float(get("REQUEST_TIMEOUT_S") or defaults.request_timeout_s),
            connect_timeout_s=float(get("CONNECT_TIMEOUT_S") or defaults.connect_timeout_s),
            server_down_retry_s=float(get("SERVER_DOWN_RETRY_S") or defaults.server_down_retry_s),
            visibility_timeout_s=int(get("VISIBILITY_TIMEOUT_S") or defaults.visibility_timeout_s),
            unacked_restore_interval_s=int(
                get("UNACKED_RESTORE_INTERVAL_S") or defaults.unacked_restore_interval_s
            ),
            hostname=get("HOSTNAME") or defaults.hostname,
            upload=UploadSettings(
                max_completions=int(get("UPLOAD_MAX_COMPLETIONS") or upload_defaults.max_completions),
                max_bytes=int(get("UPLOAD_MAX_BYTES") or upload_defaults.max_bytes),
                max_age_s=float(get("UPLOAD_MAX_AGE_S") or upload_defaults.max_age_s),
                lock_s=float(get("UPLOAD_LOCK_S") or upload_defaults.lock_s),
            ),
            liveness_enabled=(get("LIVENESS_ENABLED") or "1").strip().lower() not in _FALSE_WORDS,
            liveness_poll_s=float(get("LIVENESS_POLL_S") or defaults.liveness_poll_s),
            liveness_stall_s=float(get("LIVENESS_STALL_S") or defaults.liveness_stall_s),
            liveness_completion_stall_s=float(
                get("LIVENESS_COMPLETION_STALL_S") or defaults.liveness_completion_stall_s
            ),
            server_restart_command=get("SERVER_RESTART_COMMAND"),
            lease_ttl_s=float(get("LEASE_TTL_S") or defaults.lease_ttl_s),
            lease_renew_s=float(get("LEASE_RENEW_S") or defaults.lease_renew_s),
            reconcile_interval_s=float(get("RECONCILE_INTERVAL_S") or defaults.reconcile_interval_s),
            stranded_grace_s=float(get("STRANDED_GRACE_S") or defaults.stranded_grace_s),
            shutdown_grace_s=float(get("SHUTDOWN_GRACE_S") or defaults.shutdown_grace_s),
            request_deadline_factor=float(get("REQUEST_DEADLINE_FACTOR") or defaults.request_deadline_factor),
            request_deadline_slack_s=float(
                get("REQUEST_DEADLINE_SLACK_S") or defaults.request_deadline_slack_s
            ),
        )
