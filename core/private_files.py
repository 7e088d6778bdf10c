"""Files that hold a secret (an API key, a Redis password): readable by their owner only."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_FILE_MODE = 0o600


def write_private(path: Path, text: str) -> None:
    """A file only its owner can read, whatever the umask, even if it existed before."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    with os.fdopen(descriptor, "w") as handle:
        os.fchmod(handle.fileno(), PRIVATE_FILE_MODE)
        handle.write(text)
