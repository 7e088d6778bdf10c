"""How draftgen's messages travel: the broker connection, its transport options and the routes, the one
configuration both the workers' app and a process that only sends messages (`enqueue`) are built from.

`sending_app` is the app of a sender: no tasks, no bootsteps, no signal handlers; it routes a task name
to its queue exactly as the workers' app does, so a message it sends is one the workers consume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workers.broker.broker_tls import broker_use_ssl
from workers.state.batch_priority import UNCLASSED_BATCH_PRIORITY
from workers.state.queues import FLUSH_TASK, GENERATE_QUEUE, GENERATE_TASK, KOMBU_PRIORITY_STEPS, UPLOAD_QUEUE
from workers.state.redis_address import is_sentinel_url, sentinel_address
from workers.state.redis_client import sentinel_kwargs

if TYPE_CHECKING:  # Celery is loaded only by a process that sends or consumes
    from celery import Celery

APP_NAME = "draftgen"
UNACKED_RESTORE_THROTTLE = 1  # sweep on every interval, not every 10th (kombu's default)
BROKER_SOCKET_TIMEOUT_S = 5  # a publish or an ack on a primary frozen or cut off fails in this
BROKER_CONNECT_TIMEOUT_S = 5
BROKER_HEALTH_CHECK_INTERVAL_S = 5
"""kombu drops a consumer's BRPOP connection whose reply is overdue by its 1 s timeout and this, looking this
often: a consumer blocked on a primary frozen or cut off (no reset, no FIN closes its socket) reconnects
through the Sentinels within ~11 s, not kombu's default of 51 s, so its GPU follows a promotion at once."""


@dataclass(frozen=True)
class BrokerOptions:
    redis_url: str
    visibility_timeout_s: int
    unacked_restore_interval_s: int


def sentinel_options(redis_url: str) -> tuple[str, dict[str, Any]]:
    """The broker URL kombu reads and the transport options it needs: for a Sentinel URL, the Sentinels'
    addresses and the primary's name (workers/state/redis_address.py); for a server's, the URL as given."""
    if not is_sentinel_url(redis_url):
        return redis_url, {}
    address = sentinel_address(redis_url)
    options = {"master_name": address.master_name, "sentinel_kwargs": sentinel_kwargs(address)}
    return address.broker_url(), options


def broker_config(options: BrokerOptions) -> dict[str, Any]:
    """Celery settings of the connection and of the messages themselves: JSON only, late acks, routes."""
    broker_url, sentinel = sentinel_options(options.redis_url)
    return {
        "broker_url": broker_url,
        "broker_use_ssl": broker_use_ssl(options.redis_url),
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            **sentinel,
            "visibility_timeout": options.visibility_timeout_s,
            "unacked_restore_interval": options.unacked_restore_interval_s,
            "unacked_restore_throttle": UNACKED_RESTORE_THROTTLE,
            "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
            "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_S,
            "health_check_interval": BROKER_HEALTH_CHECK_INTERVAL_S,
            # The transport's own (broker_transport.py), stated here too: Flower's Broker page counts a
            # queue's messages over the priority lists these options name, else over kombu's 0, 3, 6, 9.
            "priority_steps": list(KOMBU_PRIORITY_STEPS),
        },
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_routes": {
            GENERATE_TASK: {"queue": GENERATE_QUEUE, "priority": UNCLASSED_BATCH_PRIORITY},
            FLUSH_TASK: {"queue": UPLOAD_QUEUE},
        },
        "task_default_queue": GENERATE_QUEUE,
    }


def new_app(options: BrokerOptions) -> Celery:
    """A Celery app on draftgen's broker, with draftgen's transport; the caller adds what it runs."""
    from celery import Celery

    from workers.broker.broker_transport import use_for_redis_urls  # kombu, like Celery, only here

    use_for_redis_urls()
    app = Celery(APP_NAME)
    app.conf.update(broker_config(options))
    return app


def sending_app(options: BrokerOptions) -> Celery:
    """An app that only sends: it announces no sent events (Flower sees each task once a worker has it)."""
    app = new_app(options)
    app.conf.task_send_sent_event = False
    return app
