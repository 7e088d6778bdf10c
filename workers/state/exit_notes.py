"""Why a worker ended itself to be restarted: a note under its GPU label that `status` shows for an hour."""

from __future__ import annotations

import redis

from workers.state.keys import EXIT_NOTES_PATTERN, worker_exit_note_key
from workers.state.redis_client import values_matching

EXIT_NOTE_TTL_S = 3600  # `status` shows why a worker restarted itself for an hour


def leave_exit_note(client: redis.Redis, worker: str, reason: str) -> None:
    client.set(worker_exit_note_key(worker), reason, ex=EXIT_NOTE_TTL_S)


def read_exit_notes(client: redis.Redis) -> dict[str, str]:
    """Why workers ended themselves to be restarted within the last hour, by GPU label."""
    prefix_length = len(worker_exit_note_key(""))
    return {
        key.decode()[prefix_length:]: note.decode()
        for key, note in values_matching(client, EXIT_NOTES_PATTERN)
    }
