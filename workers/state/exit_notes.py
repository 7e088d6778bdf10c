"""Why a worker ended itself to be restarted: a note under its GPU label that `status` shows for an hour."""

from __future__ import annotations

import redis

from workers.state.keys import EXIT_NOTES_PATTERN, worker_exit_note_key

EXIT_NOTE_TTL_S = 3600  # `status` shows why a worker restarted itself for an hour
SCAN_COUNT = 1000


def leave_exit_note(client: redis.Redis, worker: str, reason: str) -> None:
    client.set(worker_exit_note_key(worker), reason, ex=EXIT_NOTE_TTL_S)


def read_exit_notes(client: redis.Redis) -> dict[str, str]:
    """Why workers ended themselves to be restarted within the last hour, by GPU label."""
    keys = sorted(client.scan_iter(match=EXIT_NOTES_PATTERN, count=SCAN_COUNT))
    if not keys:
        return {}
    prefix_length = len(worker_exit_note_key(""))
    return {
        key.decode()[prefix_length:]: note.decode()
        for key, note in zip(keys, client.mget(keys), strict=True)
        if note is not None
    }
