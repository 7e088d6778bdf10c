"""The files of a folder or S3 prefix by number in Redis: an explicit id's fingerprint (its holder in the
run's id buckets) names its file by a number the run gave it, not by its name, which would cost more
than the rest of the holder on a source of many shards. The output keeps names (`enqueued/` objects)."""

from __future__ import annotations

import dataclasses

import redis

from producer.enqueue.fingerprints import Fingerprint
from workers.state.keys import RunKeys
from workers.state.protocol import Scripts

NUMBER_MARK = "/"  # a file's number in a holder: a file's place inside a folder never starts with "/"


class FileNumbers:
    def __init__(self, client: redis.Redis, keys: RunKeys, scripts: Scripts) -> None:
        self._client = client
        self._keys = keys
        self._scripts = scripts
        self._numbers: dict[str, int] = {}
        self._names: dict[int, str] = {}

    def holders(self, fingerprints: list[Fingerprint]) -> list[str]:
        """Each fingerprint as Redis holds it: its file by number (numbers given to new files first)."""
        unnumbered = sorted({f.file for f in fingerprints if f.file and f.file not in self._numbers})
        if unnumbered:
            numbers = self._scripts.number_files(keys=[self._keys.files], args=unnumbered)
            self._numbers.update(zip(unnumbered, (int(n) for n in numbers), strict=True))
        return [self._numbered(f).encode() for f in fingerprints]

    def numbered(self, holders: list[str]) -> list[str]:
        """Holders as the output or an older Redis keeps them (files by name), with files by number."""
        found = [Fingerprint.decode(holder.encode()) for holder in holders]
        numbered = iter(self.holders([f for f in found if f is not None]))
        return [holder if f is None else next(numbered) for holder, f in zip(holders, found, strict=True)]

    def _numbered(self, fingerprint: Fingerprint) -> Fingerprint:
        if not fingerprint.file:
            return fingerprint
        return dataclasses.replace(fingerprint, file=f"{NUMBER_MARK}{self._numbers[fingerprint.file]}")

    def named(self, fingerprint: Fingerprint) -> Fingerprint:
        """A fingerprint read from Redis with its file's name again."""
        marked = fingerprint.file.removeprefix(NUMBER_MARK)
        if marked == fingerprint.file or not marked.isdigit():
            return fingerprint
        number = int(marked)
        if number not in self._names:
            raw = self._client.hget(self._keys.files, f"i:{number}")
            self._names[number] = raw.decode() if raw is not None else f"file #{number}"
        return dataclasses.replace(fingerprint, file=self._names[number])
