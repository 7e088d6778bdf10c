"""Where an output (a run's, or an export's) may not go, checked before anything is written there.

Refused, each with the reason (UnsupportedStoreUrl):
- a location holding a control character (a newline, a tab, an escape): never a name meant;
- a local path through `..` that lands elsewhere than it reads (`runs/link/../x` when `link` is a
  symbolic link): the folder written is not the one the user sees in the command;
- a system folder or anything under one (`SYSTEM_FOLDERS`, `/` itself): a stack run as root would write
  run.json, data/ and manifest/ among the system's files (`/dev/shm`, real storage, is allowed);
- a folder inside another run's output (a folder above it holds a `run.json`): `gc` of that run would list
  the files as orphans to delete;
- a folder that holds another run's output (a folder below it holds a `run.json`), looked for among its
  first NESTED_SCAN_ENTRIES entries: `gc` of the new run would list the other's files as its orphans.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from workers.errors import UnsupportedStoreUrl

SYSTEM_FOLDERS = tuple(
    Path(name)
    for name in (
        "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
        "/proc", "/run", "/sbin", "/sys", "/usr",
    )
)  # fmt: skip
STORAGE_UNDER_SYSTEM_FOLDERS = (Path("/dev/shm"),)  # a tmpfs: real storage
FILESYSTEM_ROOT = Path("/")
SETTINGS_KEY = "run.json"  # the run's pinned settings, at the root of its output (workers/record/manifest.py)
CONTROL_CATEGORY = "Cc"
NESTED_SCAN_ENTRIES = 20_000  # entries of an existing folder looked through for a run's output below it


def check_written_location(location: str) -> None:
    """Refuse a location as the user wrote it (before it is normalised): control characters, and a
    local path whose `..` lands elsewhere than it reads."""
    control = next((char for char in location if unicodedata.category(char) == CONTROL_CATEGORY), None)
    if control is not None:
        raise UnsupportedStoreUrl(f"{location!r} holds a control character ({control!r}): refused")
    if "://" in location or ".." not in Path(location).parts:
        return
    as_read = Path(os.path.normpath(Path(location).absolute()))
    resolved = Path(location).resolve()
    if as_read != resolved:
        raise UnsupportedStoreUrl(
            f"{location!r} goes through '..' to {str(resolved)!r}, not {str(as_read)!r} as it reads "
            "(a symbolic link on the way): write the folder itself"
        )


def check_local_place(path: Path) -> None:
    """Refuse a resolved local folder under a system folder, or inside another run's output."""
    if path == FILESYSTEM_ROOT:
        raise UnsupportedStoreUrl("'/' is the root of the file system: give a folder of its own")
    system = system_folder_of(path)
    if system is not None:
        raise UnsupportedStoreUrl(f"{str(path)!r} is under {system}, a system folder, not storage for data")
    holder = next((parent for parent in path.parents if (parent / SETTINGS_KEY).is_file()), None)
    if holder is not None:
        raise UnsupportedStoreUrl(
            f"{str(path)!r} is inside {str(holder)!r}, a run's output (it holds {SETTINGS_KEY}): "
            "give a folder of its own"
        )
    nested = nested_run_output(path)
    if nested is not None:
        raise UnsupportedStoreUrl(
            f"{str(path)!r} holds {str(nested)!r}, a run's output (it holds {SETTINGS_KEY}): "
            "give a folder of its own"
        )


def nested_run_output(path: Path) -> Path | None:
    """A folder below `path` that holds a run.json, among the first NESTED_SCAN_ENTRIES entries, or None."""
    if not path.is_dir():
        return None
    seen = 0
    for folder, subfolders, files in os.walk(path):
        if folder != str(path) and SETTINGS_KEY in files:
            return Path(folder)
        seen += len(subfolders) + len(files)
        if seen >= NESTED_SCAN_ENTRIES:
            return None
        subfolders.sort()
    return None


def system_folder_of(path: Path) -> Path | None:
    if any(path == storage or storage in path.parents for storage in STORAGE_UNDER_SYSTEM_FOLDERS):
        return None
    return next((root for root in SYSTEM_FOLDERS if path == root or root in path.parents), None)
