"""Queue and task names, and the few names of kombu's Redis transport that draftgen reads.

A module of names only: the producer, `status` and the worker bootsteps import it without building
a Celery app. kombu 5.7 (pinned in pyproject.toml) lays out a queue as a Redis list named after the
queue, each element a JSON envelope whose `body` is the base64 of the task's JSON
`[args, kwargs, embed]`; delivered but unacknowledged messages sit in the hash `unacked` (delivery
tag -> JSON `[envelope, exchange, routing key]`) and the sorted set `unacked_index` (delivery tag ->
delivery time). tests/integration/test_kombu_layout.py fails if a kombu release changes that.
"""

from __future__ import annotations

GENERATE_QUEUE = "generate"
UPLOAD_QUEUE = "upload"
QUEUES = (GENERATE_QUEUE, UPLOAD_QUEUE)
GENERATE_TASK = "draftgen.generate"
FLUSH_TASK = "draftgen.flush"

KOMBU_UNACKED_KEY = "unacked"
KOMBU_UNACKED_INDEX_KEY = "unacked_index"
EVENT_QUEUE_PREFIX = "celeryev."  # a process's queue of Celery events (`celeryev.<uuid>`), heard on Pub/Sub
TASK_OF_QUEUE = {GENERATE_QUEUE: GENERATE_TASK, UPLOAD_QUEUE: FLUSH_TASK}  # the one task each queue carries
