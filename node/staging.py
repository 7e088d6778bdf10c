"""Copy a model folder to fast local storage once per node, and prove the copy is complete.

Each file is written under a `.partial` name and renamed only once its size is right, so a crash
never leaves a file that looks complete. Files already there with the right size are skipped, so
re-running is cheap. The safetensors index is checked against the source before any shard is
copied (a missing shard fails in seconds, not after 50 GB) and against the destination at the end.
A lock file beside the destination makes concurrent runs on one node wait for each other.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from core.safe_paths import stays_inside
from node.errors import NotEnoughRoom, StagingError, VerificationFailed
from node.model_sources import ModelSource, SourceFile
from node.units import human_bytes

logger = logging.getLogger(__name__)

DEFAULT_STAGE_ROOT = Path("/dev/shm")
INDEX_FILE = "model.safetensors.index.json"
SHARD_SUFFIX = ".safetensors"
PARTIAL_SUFFIX = ".partial"
LOCK_SUFFIX = ".stage-lock"


class ProgressSink(Protocol):
    def begin(self, total_bytes: int, file_count: int) -> None: ...

    def advance(self, n_bytes: int) -> None: ...

    def end(self) -> None: ...


@dataclass(frozen=True)
class StageReport:
    destination: Path
    copied: tuple[str, ...]
    skipped: tuple[str, ...]
    bytes_copied: int


def default_destination(source: ModelSource) -> Path:
    return DEFAULT_STAGE_ROOT / source.name


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds `path` (or would, once created)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def stage_model(
    source: ModelSource,
    destination: Path,
    *,
    free_bytes: Callable[[Path], int] = free_bytes,
    progress: ProgressSink | None = None,
) -> StageReport:
    """Copy what is missing from `source` into `destination`, then verify every file."""
    files = source.list_files()
    if not files:
        raise StagingError(f"{source} holds no files")
    escaping = [f.relpath for f in files if not stays_inside(f.relpath)]
    if escaping:
        raise StagingError(
            f"{source} holds {len(escaping)} object(s) whose key would land outside {destination} "
            f"(absolute, '..', '.' or empty segments), e.g. {escaping[0]!r}: nothing was copied"
        )
    if destination.exists() and not destination.is_dir():
        raise StagingError(f"destination {destination} exists and is not a folder")
    with _exclusive(destination):
        to_copy = [f for f in files if not _already_there(destination, f)]
        needed_bytes = sum(f.size_bytes for f in to_copy)
        available_bytes = free_bytes(destination)
        if needed_bytes > available_bytes:
            raise NotEnoughRoom(str(destination), needed_bytes, available_bytes)
        logger.info(
            "staging %s into %s: %d files to copy (%s), %d already there",
            source,
            destination,
            len(to_copy),
            human_bytes(needed_bytes),
            len(files) - len(to_copy),
        )
        remaining = _refuse_bad_index_early(source, files, destination, to_copy)
        if not remaining:
            progress = None
        if progress is not None:
            progress.begin(sum(f.size_bytes for f in remaining), len(remaining))
        try:
            for file in sorted(remaining, key=lambda f: (f.size_bytes, f.relpath)):
                _copy_one(source, file, destination, progress)
        finally:
            if progress is not None:
                progress.end()
        problems = verify_folder(destination, files)
        if problems:
            raise VerificationFailed(str(destination), problems)
    skipped = {f.relpath for f in files} - {f.relpath for f in to_copy}
    return StageReport(
        destination=destination,
        copied=tuple(f.relpath for f in to_copy),
        skipped=tuple(sorted(skipped)),
        bytes_copied=needed_bytes,
    )


def verify_folder(folder: Path, expected: list[SourceFile]) -> list[str]:
    """Every expected file present with its size, and the shard index consistent with the shards present."""
    problems = []
    for file in expected:
        path = folder / file.relpath
        if not path.is_file():
            problems.append(f"{file.relpath} is missing")
        elif (size := path.stat().st_size) != file.size_bytes:
            problems.append(f"{file.relpath} has {size} bytes, the source has {file.size_bytes}")
    index = folder / INDEX_FILE
    if index.is_file():
        present = {p.name for p in folder.iterdir() if p.is_file() and p.name.endswith(SHARD_SUFFIX)}
        problems += check_index(index.read_bytes(), present)
    return problems


def check_index(index_json: bytes, present_shards: set[str]) -> list[str]:
    """Problems between a `model.safetensors.index.json` and the shard files actually present."""
    try:
        weight_map = json.loads(index_json)["weight_map"]
        listed = set(weight_map.values())
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return [f"{INDEX_FILE} is not a valid index ({type(error).__name__}: {error})"]
    missing = [
        f"shard {name} is listed in {INDEX_FILE} but missing" for name in sorted(listed - present_shards)
    ]
    unlisted = [
        f"shard {name} is present but not listed in {INDEX_FILE}" for name in sorted(present_shards - listed)
    ]
    return missing + unlisted


def _refuse_bad_index_early(
    source: ModelSource, files: list[SourceFile], destination: Path, to_copy: list[SourceFile]
) -> list[SourceFile]:
    """Check the index against the source's own listing, fetching the (small) index first if needed.

    Returns the files still to copy.
    """
    index = next((f for f in files if f.relpath == INDEX_FILE), None)
    if index is None:
        return to_copy
    if index in to_copy:
        _copy_one(source, index, destination, None)
    source_shards = {f.relpath for f in files if "/" not in f.relpath and f.relpath.endswith(SHARD_SUFFIX)}
    problems = check_index((destination / INDEX_FILE).read_bytes(), source_shards)
    if problems:
        raise VerificationFailed(str(source), problems)
    return [f for f in to_copy if f is not index]


def _already_there(destination: Path, file: SourceFile) -> bool:
    path = destination / file.relpath
    return path.is_file() and path.stat().st_size == file.size_bytes


def _copy_one(
    source: ModelSource, file: SourceFile, destination: Path, progress: ProgressSink | None
) -> None:
    target = destination / file.relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + PARTIAL_SUFFIX)

    def advance(n_bytes: int) -> None:
        if progress is not None:
            progress.advance(n_bytes)

    try:
        source.fetch(file, partial, advance)
        size = partial.stat().st_size
        if size != file.size_bytes:
            raise VerificationFailed(
                str(destination),
                [f"{file.relpath} arrived with {size} bytes, the source listed {file.size_bytes}"],
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


@contextmanager
def _exclusive(destination: Path) -> Iterator[None]:
    destination.parent.mkdir(parents=True, exist_ok=True)
    lock_path = destination.parent / f".{destination.name}{LOCK_SUFFIX}"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
