"""Queue and task names, and the few names of kombu's Redis transport that draftgen reads.

A module of names only: the producer, `status` and the worker bootsteps import it without building
a Celery app. kombu 5.7 (pinned in pyproject.toml) lays out a queue as a Redis list named after the
queue, each element a JSON envelope whose `body` is the base64 of the task's JSON
`[args, kwargs, embed]`; delivered but unacknowledged messages sit in the hash `unacked` (delivery
tag -> JSON `[envelope, exchange, routing key]`) and the sorted set `unacked_index` (delivery tag ->
delivery time). A queue's messages of each priority step wait in a list of their own: the queue's
name for step 0, `<queue>\x06\x16<step>` for the others; a consumer pops step 0 first, so with Redis
Celery's priority 0 is the highest. tests/integration/test_kombu_layout.py fails if a kombu release
changes that.
"""

from __future__ import annotations

GENERATE_QUEUE = "generate"
UPLOAD_QUEUE = "upload"
QUEUES = (GENERATE_QUEUE, UPLOAD_QUEUE)
GENERATE_TASK = "draftgen.generate"
FLUSH_TASK = "draftgen.flush"

# A batch dispatched again once its work began (taken back from a dead or silent worker, or handed back)
# is delivered before every batch not begun yet: a conversation under way resumes before a new one starts.
# New batches go at 1-9, by the work they are expected to take (workers/state/batch_priority.py).
RESUMED_BATCH_PRIORITY = 0
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = tuple(
    range(10)
)  # every Celery priority a list of its own (kombu's default: 0, 3, 6, 9)

KOMBU_UNACKED_KEY = "unacked"
KOMBU_UNACKED_INDEX_KEY = "unacked_index"
EVENT_QUEUE_PREFIX = "celeryev."  # a process's queue of Celery events (`celeryev.<uuid>`), heard on Pub/Sub
TASK_OF_QUEUE = {GENERATE_QUEUE: GENERATE_TASK, UPLOAD_QUEUE: FLUSH_TASK}  # the one task each queue carries
LONGEST_COUNTDOWN_S = 3600.0
"""No message of draftgen's is sent to run later than this: its own retries wait a minute at most, and
DRAFTGEN_SERVER_DOWN_RETRY_S is held under it. A task whose `eta` lies further ahead (with CLOCK_SKEW_S
between hosts' clocks) is not one of ours: Celery would hold it, and its batch, until then."""
CLOCK_SKEW_S = 300.0


def queue_lists(queue: str) -> tuple[str, ...]:
    """The Redis lists of a queue's messages, one per priority step, the first served first."""
    return tuple(
        queue if step == 0 else f"{queue}{KOMBU_PRIORITY_SEP}{step}" for step in KOMBU_PRIORITY_STEPS
    )
