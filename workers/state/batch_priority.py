"""A batch's place in the generate queue: its id names the class of work it is expected to take.

The producer batches a chunk's prompts longest expected work first (producer/enqueue/work_order.py) and names
each batch's class in its id, `w<priority>.<16 hex digits>`. The class is the Celery priority of the
batch's message: kombu's Redis transport pops a queue's lower priorities first, so the longest known work
is delivered first across the run and every GPU, and the run ends on its shortest. Whatever sends a
batch's message again (a crashed enqueue's outbox, the reconciler) reads the priority off the id, with no
read of the batch. A batch dispatched again once its work began goes before all new work
(RESUMED_BATCH_PRIORITY); an id naming no class (a batch enqueued before classes) goes in the middle.
"""

from __future__ import annotations

from workers.state.queues import KOMBU_PRIORITY_STEPS, RESUMED_BATCH_PRIORITY

LONGEST_WORK_PRIORITY = RESUMED_BATCH_PRIORITY + 1
SHORTEST_WORK_PRIORITY = KOMBU_PRIORITY_STEPS[-1]
UNCLASSED_BATCH_PRIORITY = (LONGEST_WORK_PRIORITY + SHORTEST_WORK_PRIORITY) // 2
CLASS_PREFIX = "w"
CLASS_SEPARATOR = "."


def classed_batch_id(priority: int, unique: str) -> str:
    """The id of a new batch of this work class (a priority of new work)."""
    if not LONGEST_WORK_PRIORITY <= priority <= SHORTEST_WORK_PRIORITY:
        raise ValueError(
            f"a new batch's priority is {LONGEST_WORK_PRIORITY}-{SHORTEST_WORK_PRIORITY}, not {priority}"
        )
    return f"{CLASS_PREFIX}{priority}{CLASS_SEPARATOR}{unique}"


def batch_priority(batch_id: str) -> int:
    """The priority a new batch's message goes with: the class its id names, else the middle one."""
    head, separator, _ = batch_id.partition(CLASS_SEPARATOR)
    digits = head.removeprefix(CLASS_PREFIX)
    if separator and head.startswith(CLASS_PREFIX) and digits.isdecimal() and len(digits) == 1:
        priority = int(digits)
        if LONGEST_WORK_PRIORITY <= priority <= SHORTEST_WORK_PRIORITY:
            return priority
    return UNCLASSED_BATCH_PRIORITY
