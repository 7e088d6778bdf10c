"""A worker's record of its server: the facts read from `/server_info`, kept in Redis once per change.

Read before every batch (one small GET), so a server restarted with another model or other
speculative settings is told apart from the batch on. Completions name the facts through
`Origin.server`; the uploader copies the facts they name into the run's output.
"""

from __future__ import annotations

import logging
from typing import Protocol

import msgspec
import redis

from core.records import Origin
from inference.server_facts import encode_facts, facts_from_server_info, facts_id
from workers.state.keys import SERVERS_KEY

log = logging.getLogger(__name__)


class ServerInfoSource(Protocol):
    @property
    def server_url(self) -> str: ...

    def server_info(self) -> dict[str, object] | None: ...


class ServerRecord:
    """The origin a worker stamps on its completions, naming its server's current facts."""

    def __init__(self, client: redis.Redis, source: ServerInfoSource, origin: Origin) -> None:
        self._client = client
        self._source = source
        self._origin = origin

    @property
    def origin(self) -> Origin:
        return self._origin

    def refresh(self) -> Origin:
        """Read the server's facts; record them if new. A server that does not answer keeps the last."""
        info = self._source.server_info()
        if info is None:
            if self._origin.server is None:
                log.warning(
                    "%s gave no /server_info: its rows will name no server facts", self._source.server_url
                )
            return self._origin
        facts = facts_from_server_info(info, self._source.server_url)
        identity = facts_id(facts)
        if identity != self._origin.server:
            self._client.hsetnx(SERVERS_KEY, identity, encode_facts(facts))
            log.info(
                "server %s: facts %s (%s)",
                self._source.server_url,
                identity,
                msgspec.json.encode(facts).decode(),
            )
            self._origin = msgspec.structs.replace(self._origin, server=identity)
        return self._origin
