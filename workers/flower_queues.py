"""Flower's Broker page lists both of draftgen's queues, always.

Flower lists the queues its cached `inspect active_queues` answers name (taken when Flower starts, and
again when a worker's page is opened), and falls back to the configured ones only when no worker ever
answered: a Flower started before the uploader, or while the upload queue's worker was away, showed
`generate` alone for good. Both queues are part of every run, so they are listed whatever the cache
holds; the counts are Flower's own (every priority list, broker.py's `priority_steps`).

Installed only in Flower's process (`celery -A workers flower`, see flower_guard.py for how that is told),
when Flower's application is built; Flower is imported there and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from celery import Celery
from celery.signals import import_modules

from workers.flower_guard import flower_is_starting
from workers.state.queues import QUEUES


def with_every_queue(names: Iterable[str]) -> list[str]:
    """The queue names Flower found, and draftgen's own, each once, sorted as Flower sorts them."""
    return sorted(set(names) | set(QUEUES))


def list_every_queue(**_: object) -> None:
    """The `import_modules` receiver: make Flower's queue list (Broker page, /api/queues/length) whole."""
    from flower.views import BaseHandler  # only in Flower's process, which has loaded it already

    found: Callable[[Any], list[str]] = BaseHandler.get_active_queue_names

    def every_queue_name(handler: Any) -> list[str]:
        return with_every_queue(found(handler))

    BaseHandler.get_active_queue_names = every_queue_name


def install_flower_queues(app: Celery) -> bool:
    """Under `celery -A workers flower`, list both queues on Flower's Broker page. Returns whether it did."""
    if not flower_is_starting():
        return False
    import_modules.connect(list_every_queue, sender=app, weak=False)
    return True
