"""What the network may make a worker do: by default, answer harmless questions only.

Remote control travels on one Pub/Sub channel (`/0.celery.pidbox`), and Redis's ACL cannot let a user
subscribe to a channel without letting it publish there: every GPU node's password could broadcast
`shutdown` to the uploader, or `cancel_consumer generate` to the fleet, and stall it. So a worker refuses
every command that changes it (`shutdown`, `cancel_consumer`, `add_consumer`, `rate_limit`, `revoke`,
`time_limit`, `pool_*`, `autoscale`, `terminate`, `disable_events`...), answering the sender with the
refusal and logging it. `enable_events` (Flower turns task events on) and `heartbeat` stay.

Questions (`celery inspect`, Flower's Workers page) are answered when they change nothing that matters,
write nothing and tell nothing a node's password cannot already read in Redis; any other, a question a
later Celery adds included, is refused. Answered (Celery 5.7's questions):
- `ping`, `clock`: alive, and the logical clock (it orders events, nothing else).
- `stats`, `report`, `conf`: versions, pool and broker figures, settings. The broker's password is not in
  them: `stats` drops it, `report` and `conf` mask it and every setting named like a secret
  (tests/integration/test_malformed_messages.py asks the uploader for all three).
- `active`, `reserved`, `scheduled`, `revoked`, `query_task`, `active_queues`, `registered`: what the
  worker holds (run names and batch ids, which Redis shows any node), the queues it reads, the tasks it
  knows (`registered` reads the attributes it is asked for by name; Celery leaves out private ones).
- `hello`: mingle's question when a worker starts, answered with the clock and no revoked ids; the ids it
  carries are not taken (below).
Refused: `objgraph` (writes a file), `memsample` (keeps a sample per call: memory on demand), `memdump`.

A worker's revoked set takes nothing from the network. draftgen never revokes a task (`revoke` is
refused), yet Celery merges into the set the ids a `hello` carries and those in the replies to a worker's
own `hello` at start-up (mingle, on under systemd), and discards every task whose id is there: a node that
reads the queued task ids could have every worker drop them. Both are ignored here. (An expired task's id
is the third way in: a message with an expiry never reaches Celery, workers/broker/message_check.py.)

`DRAFTGEN_REMOTE_CONTROL_COMMANDS=true` keeps Celery's own behaviour, for a machine whose every Redis
user is trusted. Stop or restart a worker with its service manager (systemd, honcho), not a broadcast.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.consumer.mingle import Mingle
from celery.worker.control import Panel

log = logging.getLogger(__name__)

CONTROL_TYPE = "control"
HARMLESS_CONTROL_COMMANDS = frozenset({"enable_events", "heartbeat"})
ANSWERED_QUESTIONS = frozenset(
    {
        "active",
        "active_queues",
        "clock",
        "conf",
        "hello",
        "ping",
        "query_task",
        "registered",
        "report",
        "reserved",
        "revoked",
        "scheduled",
        "stats",
    }
)
HELLO = "hello"

Handler = Callable[..., Any]


def limit_remote_control() -> list[str]:
    """In this process: refuse every command not obeyed, answer `hello` without taking revoked ids, and
    take none from mingle's replies. The names of the commands refused."""
    refused = sorted(name for name, meta in Panel.meta.items() if not _obeyed(name, meta.type))
    for name in refused:
        _replace(name, _refusal(name))
    _replace(HELLO, hello_without_revocations)
    Mingle.on_revoked_received = _ignore_offered_revocations
    return refused


def hello_without_revocations(
    state: Any, from_node: str, revoked: object = None, **_: object
) -> dict[str, Any] | None:
    """Celery's `hello` (a starting worker's mingle), without merging the ids it offers nor giving ours."""
    if from_node == state.hostname:
        return None
    if revoked:
        log.warning("took none of the revoked task ids %s offered: draftgen revokes no task", from_node)
    return {"revoked": [], "clock": state.app.clock.forward()}


def _ignore_offered_revocations(self: Mingle, c: Any, revoked: object) -> None:
    if revoked:
        log.warning("mingle: took none of the revoked task ids a neighbour offered: draftgen revokes no task")


def _obeyed(name: str, kind: str) -> bool:
    return name in (HARMLESS_CONTROL_COMMANDS if kind == CONTROL_TYPE else ANSWERED_QUESTIONS)


def _replace(name: str, handler: Handler) -> None:
    """The command's handler, under its name and its alias."""
    Panel.data[name] = handler
    alias = Panel.meta[name].alias
    if alias:
        Panel.data[alias] = handler


def _refusal(name: str) -> Handler:
    def refuse(state: Any, **arguments: Any) -> dict[str, str]:
        log.warning("refused the remote-control command %r: workers obey harmless questions only", name)
        return {
            "error": f"{name} refused: draftgen workers obey remote-control questions only "
            "(DRAFTGEN_REMOTE_CONTROL_COMMANDS)"
        }

    return refuse
