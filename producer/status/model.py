"""The status snapshot: records only, built by `producer.status.gather` and shown by the view and the
metrics exporter."""

from __future__ import annotations

import msgspec

from core.records import Record
from producer.status.quarantine_figures import QuarantineFigures
from producer.status.suspects import SuspectFigures
from workers.broker.parked_messages import ParkedCount


class Progress(Record, frozen=True):
    enqueued: int  # the total: every prompt accepted into the run
    committed: int  # in an object listed in the manifest
    staged: int  # generated, awaiting upload
    dead_lettered: int
    rejected_rows: int  # refused at enqueue, never part of `enqueued`
    remaining: int  # still to generate
    committed_fraction: float
    dead_pending: int = 0  # dead letters not yet committed to the output
    open_batches: int = 0  # batches not finished yet (generating, queued, or handed back)


class Rates(Record, frozen=True):
    window_s: float
    completions: int
    output_tokens: int
    completions_per_s: float
    output_tokens_per_s: float


class Throughput(Record, frozen=True):
    last_minute: Rates
    whole_run: Rates
    mean_output_tokens: float | None
    first_completion_at: float | None  # Redis clock, unix seconds
    last_completion_at: float | None
    turns: int = 0  # assistant turns generated over the whole run (a conversation of 4 counts 4)


class Eta(Record, frozen=True):
    seconds: float | None  # None: unknown, see `basis`
    finishes_at: float | None  # unix seconds
    basis: str


class Cost(Record, frozen=True):
    gpus: int
    elapsed_s: float
    gpu_hours: float
    projected_gpu_hours: float | None
    price_per_gpu_hour: float | None
    so_far_usd: float | None
    projected_total_usd: float | None
    assumption: str


class GpuRow(Record, frozen=True):
    worker: str  # host/gpuN
    output_tokens_per_s: float  # this run's, over the last minute
    completions_last_minute: int
    in_flight: int | None  # None: no live heartbeat
    max_in_flight: int | None
    spec_accept_length: float | None
    server_health: int | None  # HTTP status of /health
    suspended: bool | None
    heartbeat_age_s: float | None
    life: str = ""  # its worker process: alive, silent, dead (workers/recovery/seat_view.py)


class HeldWork(Record, frozen=True):
    """The run's batches one GPU's worker holds under leases, and when they come back if it is gone."""

    worker: str  # the GPU label of the holder
    life: str  # its worker process: alive, silent, dead
    batches: int
    leases_end_at: float  # Redis clock: the last of its leases runs out then, unless renewed
    back_by: float  # at the latest the reconciler sends them again (leases_end_at + one interval)


class QueueDepth(Record, frozen=True):
    queue: str
    waiting: int
    in_flight: int


class UploadBacklog(Record, frozen=True):
    staged: int
    staged_bytes: int
    oldest_staged_age_s: float | None
    objects_committed: int
    committed_bytes: int


class QualityFigures(Record, frozen=True):
    judged: int  # completions, plus truncations dropped by the run's policy
    counts: dict[str, int]
    rates: dict[str, float]
    finish_reasons: dict[str, int]


class GateFigures(Record, frozen=True):
    judged_since_resume: int
    min_completions: int
    empty_answer_rate: float
    max_empty_answer_rate: float
    truncated_rate: float
    max_truncated_rate: float
    failing: str | None  # what the gate would say now; None when healthy or too early
    truncated_thinking_policy: str


class PauseFigures(Record, frozen=True):
    reason: str
    by: str
    at: float
    for_s: float


class RedisPlace(Record, frozen=True):
    """The primary a set of Sentinels names (producer/status/redis_place.py)."""

    master_name: str
    primary: str  # host:port
    sentinels: int
    answering: int
    failovers: int  # the primary's configuration epoch: raised by one at each failover
    replicas: int


class RunStatus(Record, frozen=True):
    run: str
    now: float  # Redis clock, unix seconds
    state: str
    progress: Progress
    throughput: Throughput
    eta: Eta
    cost: Cost
    gpus: list[GpuRow]
    queues: list[QueueDepth]
    queues_note: str
    upload: UploadBacklog
    dead_letters: dict[str, int]  # by reason
    quality: QualityFigures
    gate: GateFigures
    paused: PauseFigures | None
    warnings: list[str]
    quarantine: QuarantineFigures | None = None  # records kept apart (None: never any)
    # Malformed messages of the whole fleet (no run is theirs), by queue and reason.
    parked_messages: list[ParkedCount] = msgspec.field(default_factory=list)
    output: str = ""  # the run's output, as pinned
    held: list[HeldWork] = msgspec.field(default_factory=list)  # by GPU
    redis: RedisPlace | None = None  # when Sentinels name the primary
    suspects: SuspectFigures | None = None  # prompts suspected of poison, still to settle
