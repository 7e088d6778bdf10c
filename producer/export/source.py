"""A run's committed completions, read from its output alone (the manifest and the objects it names).

Export never asks Redis: it runs after the fleet and Redis are gone. Parts come in part order and
rows in their stored order, so every pass over the same output sees the same rows in the same order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import msgspec

from core.records import Completion
from core.run_settings.model import RunSettings
from inference.server_facts import ServerFacts, decode_facts
from producer.export.errors import ExportError
from producer.upkeep.recover import read_run_settings
from workers.errors import ObjectMissing
from workers.record.manifest import SERVERS_PREFIX, ManifestEntry, read_manifest
from workers.record.object_store import ObjectStore
from workers.record.parquet_io import read_completions


class RunOutput:
    """The committed parts of one run's output."""

    def __init__(self, store: ObjectStore, run: str) -> None:
        self.store = store
        self.settings: RunSettings = read_run_settings(store, run)
        self.run = run
        entries = read_manifest(store)
        foreign = [entry.part for entry in entries if entry.run and entry.run != run]
        if foreign:
            raise ExportError(f"{store.url}: parts {foreign[:5]} were committed by another run than {run!r}")
        self.parts: list[ManifestEntry] = [entry for entry in entries if entry.key is not None]

    @property
    def committed_rows(self) -> int:
        return sum(entry.count for entry in self.parts)

    def fingerprint(self) -> str:
        """Names exactly the committed content: the parts and their checksums."""
        listing = [(entry.part, entry.key, entry.sha256) for entry in self.parts]
        return hashlib.sha256(msgspec.json.encode(listing)).hexdigest()

    def completions(self, entry: ManifestEntry) -> list[Completion]:
        """A part's rows, its checksum checked: a damaged output is refused, never exported."""
        assert entry.key is not None
        try:
            data = self.store.get(entry.key)
        except ObjectMissing as error:
            raise ExportError(f"{entry.key} is named by the manifest but absent: run `verify`") from error
        if entry.sha256 is not None and hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ExportError(f"{entry.key}: its checksum differs from the manifest's: run `verify`")
        return read_completions(data)

    def rows(self) -> Iterator[tuple[ManifestEntry, Completion]]:
        for entry in self.parts:
            for completion in self.completions(entry):
                yield entry, completion

    def server_facts(self) -> dict[str, ServerFacts]:
        """The facts of every server the rows name, by facts id."""
        facts: dict[str, ServerFacts] = {}
        for info in self.store.list(SERVERS_PREFIX):
            identity = info.key.removeprefix(SERVERS_PREFIX).removesuffix(".json")
            facts[identity] = decode_facts(self.store.get(info.key))
        return facts
