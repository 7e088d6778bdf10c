"""The Celery app: Redis as broker, late acks, JSON messages only, events on for Flower.

Configured from `WorkerSettings` (the `DRAFTGEN_*` environment) when the process starts.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from workers.heartbeat_step import HeartbeatStep
from workers.liveness_step import LivenessStep
from workers.settings import WorkerSettings

GENERATE_QUEUE = "generate"
UPLOAD_QUEUE = "upload"
GENERATE_TASK = "draftgen.generate"
FLUSH_TASK = "draftgen.flush"
UNACKED_RESTORE_THROTTLE = 1  # sweep on every interval, not every 10th (kombu's default)
BROKER_SOCKET_TIMEOUT_S = 30
BROKER_CONNECT_TIMEOUT_S = 5
BROKER_HEALTH_CHECK_INTERVAL_S = 25


def celery_config(settings: WorkerSettings) -> dict[str, Any]:
    return {
        "broker_url": settings.redis_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": settings.unacked_restore_interval_s,
            "unacked_restore_throttle": UNACKED_RESTORE_THROTTLE,
            "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
            "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_S,
            "health_check_interval": BROKER_HEALTH_CHECK_INTERVAL_S,
        },
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "task_routes": {
            GENERATE_TASK: {"queue": GENERATE_QUEUE},
            FLUSH_TASK: {"queue": UPLOAD_QUEUE},
        },
        "task_default_queue": GENERATE_QUEUE,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # Several batches per worker share one in-flight window (see workers/generation.py).
        "worker_pool": "threads",
        "worker_concurrency": settings.batches_in_flight,
    }


def make_app(settings: WorkerSettings) -> Celery:
    app = Celery("draftgen", include=["workers.tasks"])
    app.conf.update(celery_config(settings))
    app.conf.draftgen_settings = settings
    app.steps["consumer"].add(HeartbeatStep)
    app.steps["consumer"].add(LivenessStep)  # generate workers watch their server's token progress
    return app


app = make_app(WorkerSettings.from_env())
