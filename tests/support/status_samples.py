"""Runs' status as the view and `wait` see them, built by hand: one paused young run to vary."""

from __future__ import annotations

from producer.status.figures import STATE_PAUSED, estimate_cost, gpu_rows, make_progress
from producer.status.model import (
    Eta,
    GateFigures,
    PauseFigures,
    QualityFigures,
    QueueDepth,
    Rates,
    RunStatus,
    Throughput,
    UploadBacklog,
)
from workers.state.heartbeats import WorkerHeartbeat

START_S = 1_800_000_000.0  # the fake clock's first completion


def heartbeat(worker: str, *, in_flight: int = 48, updated_at: float = START_S) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker=worker,
        host=worker.split("/")[0],
        gpu=int(worker[-1]),
        server_url="http://127.0.0.1:30000",
        in_flight=in_flight,
        max_in_flight=48,
        suspended=False,
        server_health=200,
        spec_accept_length=3.4,
        updated_at=updated_at,
    )


def paused_young_status(rates: Rates) -> RunStatus:
    """A run paused by the gate 4 s after its first completion, on one GPU."""
    return RunStatus(
        run="demo",
        now=START_S + 4,
        state=STATE_PAUSED,
        progress=make_progress(enqueued=1_000, committed=0, staged=3, dead=0, rejected=2),
        throughput=Throughput(
            last_minute=rates,
            whole_run=rates,
            mean_output_tokens=2_000.0,
            first_completion_at=START_S,
            last_completion_at=START_S + 3,
        ),
        eta=Eta(seconds=None, finishes_at=None, basis="unknown while the run is paused"),
        cost=estimate_cost(gpus=1, elapsed_s=4, eta_s=None, price_per_gpu_hour=None, price_source=""),
        gpus=gpu_rows([], 4.0, [heartbeat("node/gpu0")], [], now_s=START_S + 4),
        queues=[
            QueueDepth(queue="generate", waiting=30, in_flight=3),
            QueueDepth(queue="upload", waiting=0, in_flight=0),
        ],
        queues_note="note",
        upload=UploadBacklog(
            staged=3, staged_bytes=9_000, oldest_staged_age_s=2.0, objects_committed=0, committed_bytes=0
        ),
        dead_letters={},
        quality=QualityFigures(
            judged=3,
            counts={"truncated_in_thinking": 3},
            rates={"truncated_in_thinking": 1.0},
            finish_reasons={"length": 3},
        ),
        gate=GateFigures(
            judged_since_resume=3,
            min_completions=2,
            empty_answer_rate=0,
            max_empty_answer_rate=0.2,
            truncated_rate=1.0,
            max_truncated_rate=0.3,
            failing="3 of the last 3 hit max_tokens",
            truncated_thinking_policy="keep",
        ),
        paused=PauseFigures(
            reason="3 of the last 3 hit max_tokens", by="quality-gate", at=START_S + 3, for_s=1.0
        ),
        warnings=["something odd"],
    )
