"""Reading a small file a user names (a run's settings file, a tokenizer) with a bound: a device, a FIFO,
a folder, or a file past the bound is refused with the reason before more than the bound is read (a
`--config /dev/zero` read whole ended in a MemoryError traceback)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from core.errors import SettingsRefused

FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)
MIB = 1 << 20


def kind_of_mode(mode: int) -> str | None:
    """What a file mode names when it is not a regular file (a folder, a device, a pipe, a socket)."""
    return next((name for test, name in FILE_KINDS if test(mode)), None)


def read_bounded(path: Path, *, limit_bytes: int, what: str) -> bytes:
    """The bytes of the regular file at `path`, at most `limit_bytes`; SettingsRefused naming `what` and
    the path otherwise (missing, unreadable, not a regular file, past the bound)."""
    try:
        # O_NONBLOCK: opening a named pipe for reading would wait for a writer; a regular file ignores it
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise SettingsRefused(f"cannot read {what} {path}: {error.strerror}") from error
    kind = kind_of_mode(os.fstat(descriptor).st_mode)
    if kind is not None:
        os.close(descriptor)
        raise SettingsRefused(f"{what} {path} is {kind}, not a file")
    with os.fdopen(descriptor, "rb") as handle:
        try:
            data = handle.read(limit_bytes + 1)
        except OSError as error:
            raise SettingsRefused(f"cannot read {what} {path}: {error.strerror}") from error
    if len(data) > limit_bytes:
        raise SettingsRefused(f"{what} {path} is over {limit_bytes / MIB:,.0f} MiB: not {what}")
    return data
