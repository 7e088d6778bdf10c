"""Which of Celery's remote-control commands a worker obeys: by default, questions only.

Remote control travels on one Pub/Sub channel (`/0.celery.pidbox`), and Redis's ACL cannot let a user
subscribe to a channel without letting it publish there: every GPU node's password could broadcast
`shutdown` to the uploader, or `cancel_consumer generate` to the fleet, and stall it. So a worker keeps
answering `inspect` (Flower's Workers page, `celery inspect stats`) and refuses every command that
changes it (`shutdown`, `cancel_consumer`, `add_consumer`, `rate_limit`, `revoke`, `time_limit`,
`pool_*`, `autoscale`, `terminate`, `disable_events`...), answering the sender with the refusal and
logging it once a command. `enable_events` (Flower turns task events on) and `heartbeat` stay.

`DRAFTGEN_REMOTE_CONTROL_COMMANDS=true` gives them back, for a machine whose every Redis user is trusted.
Stop or restart a worker with its service manager (systemd, honcho), not a broadcast.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.control import Panel

log = logging.getLogger(__name__)

CONTROL_TYPE = "control"
HARMLESS_CONTROL_COMMANDS = frozenset({"enable_events", "heartbeat"})


def refuse_control_commands() -> list[str]:
    """Replace, in this process, every command that changes a worker by one that refuses; their names."""
    refused = sorted(
        name
        for name, meta in Panel.meta.items()
        if meta.type == CONTROL_TYPE and name not in HARMLESS_CONTROL_COMMANDS
    )
    for name in refused:
        Panel.data[name] = _refusal(name)
    return refused


def _refusal(name: str) -> Callable[..., dict[str, str]]:
    def refuse(state: Any, **arguments: Any) -> dict[str, str]:
        log.warning("refused the remote-control command %r: workers obey inspect queries only", name)
        return {
            "error": f"{name} refused: draftgen workers obey remote-control questions only "
            "(DRAFTGEN_REMOTE_CONTROL_COMMANDS)"
        }

    return refuse
