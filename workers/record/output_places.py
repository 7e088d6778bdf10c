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

And where a new run's output or an export's destination is made (`check_fresh_place`):
- /var, /opt, /srv and anything under them, a home folder itself (`/root`, `/home/<user>`) or a hidden
  folder in one (`~/.ssh`, `~/.config`), unless the user says they mean it (`--allow-location`): a careless
  `--output` would fill `/var/spool/cron/crontabs` or `~/.ssh` with files that are not theirs;
- an existing folder that holds anything but what is already the run's or the export's own (its run.json,
  an export's record): its files would be mixed with the run's, and `gc` would count them as orphans.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence
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
ALLOW_LOCATION_FLAG = "--allow-location"  # `enqueue` and `export`: the user means a shared place
SHARED_FOLDERS = tuple(Path(name) for name in ("/var", "/opt", "/srv"))  # the system's, others' or services'
ROOT_HOME, HOMES = Path("/root"), Path("/home")
HIDDEN_PREFIX = "."
ENTRIES_NAMED = 3  # of a folder refused for what it holds
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


def shared_place_of(path: Path) -> str | None:
    """Why `path` is no place for a new output without `--allow-location`, or None."""
    shared = next((folder for folder in SHARED_FOLDERS if path == folder or folder in path.parents), None)
    if shared is not None:
        return f"under {shared}"
    if path == ROOT_HOME or path.parent == HOMES:
        return "a home folder"
    home = (
        ROOT_HOME if ROOT_HOME in path.parents else next((p for p in path.parents if p.parent == HOMES), None)
    )
    if home is not None and path.relative_to(home).parts[0].startswith(HIDDEN_PREFIX):
        return f"inside {home / path.relative_to(home).parts[0]}, a hidden folder of the home {home}"
    return None


def check_fresh_place(path: Path, *, ours: Sequence[str], allow_shared: bool) -> None:
    """Refuse a new run's output or an export's destination that is a shared place (unless allowed), or an
    existing folder holding anything while none of `ours` (the names that make it already this run's or
    this export's) is there."""
    if not allow_shared and (why := shared_place_of(path)) is not None:
        raise UnsupportedStoreUrl(
            f"{str(path)!r} is {why}: not a place for a run's files; {ALLOW_LOCATION_FLAG} if you mean it"
        )
    if not path.is_dir() or any((path / name).exists() for name in ours):
        return
    with os.scandir(path) as entries:
        first = [entry.name for _, entry in zip(range(ENTRIES_NAMED + 1), entries, strict=False)]
    if first:
        shown = ", ".join(first[:ENTRIES_NAMED]) + (", …" if len(first) > ENTRIES_NAMED else "")
        raise UnsupportedStoreUrl(
            f"{str(path)!r} already holds files that are not this run's ({shown}): give a new or empty folder"
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
