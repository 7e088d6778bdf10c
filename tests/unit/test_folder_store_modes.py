"""Objects written into an output folder land where it is named, with the mode the umask gives."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.record.storage import FolderStore, normalise_output, open_store

GROUP_READABLE_UMASK = 0o022
PRIVATE_UMASK = 0o077


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(GROUP_READABLE_UMASK)
    yield
    os.umask(previous)


def mode_of(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_objects_put_whole_are_readable_by_others_under_a_022_umask(tmp_path: Path, umask_022: None) -> None:
    store = FolderStore(tmp_path)
    store.put("run.json", b"{}")
    assert mode_of(tmp_path / "run.json") == 0o644


def test_objects_put_only_if_absent_and_copied_files_get_the_same_mode(
    tmp_path: Path, umask_022: None
) -> None:
    store = FolderStore(tmp_path)
    assert store.put_if_absent("manifest/00000.json", b"{}")
    source = tmp_path / "part.parquet"
    source.write_bytes(b"rows")
    store.put_file("data/part-0.parquet", source)
    assert mode_of(tmp_path / "manifest" / "00000.json") == 0o644
    assert mode_of(tmp_path / "data" / "part-0.parquet") == 0o644


def test_a_private_umask_keeps_objects_private(tmp_path: Path) -> None:
    previous = os.umask(PRIVATE_UMASK)
    try:
        store = FolderStore(tmp_path)
    finally:
        os.umask(previous)
    store.put("run.json", b"{}")
    assert mode_of(tmp_path / "run.json") == 0o600


def test_an_output_folder_with_a_space_in_its_name_is_written_where_it_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "my runs" / "run 1"
    store = open_store(normalise_output(str(folder)))
    store.put("run.json", b"{}")
    assert (folder / "run.json").read_bytes() == b"{}"
    assert not list(tmp_path.glob("*%20*"))


def test_a_manifest_entry_survives_a_power_cut_once_written_because_its_folder_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_folders: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced_folders.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store = FolderStore(tmp_path)

    assert store.put_if_absent("manifest/part-000000.json", b"{}")
    store.put("data/part-000000-abc.parquet", b"rows")

    assert str(tmp_path / "manifest") in synced_folders
    assert str(tmp_path / "data") in synced_folders
