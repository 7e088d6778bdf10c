"""Errors of the GPU-node tools: serving and staging (readiness raises inference.errors.ServerNotReady).

NodeError                    anything this package raises on purpose
├── OptionError            a bad option value; the message names the option and why
├── LaunchError              a server process could not be started or did not stay up
│   └── ServerExited         a server process ended while it was supposed to run
└── StagingError             the model folder could not be copied or is incomplete
    ├── NotEnoughRoom        the destination lacks the free bytes the copy needs
    └── VerificationFailed   a file is missing, has the wrong size, or the shard index disagrees
"""

from __future__ import annotations

from node.units import human_bytes


class NodeError(Exception):
    """Root of every error raised on purpose by `node`."""


class OptionError(NodeError, ValueError):
    """An option has a value that cannot work; the message says which and why."""


class LaunchError(NodeError):
    """A server process could not be started or did not stay up."""


class ServerExited(LaunchError):
    """A server process ended while it was supposed to keep running."""

    def __init__(self, gpu: int, returncode: int, log_tail: str) -> None:
        self.gpu = gpu
        self.returncode = returncode
        self.log_tail = log_tail
        super().__init__(
            f"the SGLang server on GPU {gpu} exited with code {returncode}; "
            f"last lines of its log:\n{log_tail}"
        )


class StagingError(NodeError):
    """The model folder could not be copied, or the copy is incomplete."""


class NotEnoughRoom(StagingError):
    """The destination file system has fewer free bytes than the copy needs."""

    def __init__(self, destination: str, needed_bytes: int, available_bytes: int) -> None:
        self.destination = destination
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        super().__init__(
            f"not enough room in {destination}: the copy needs {human_bytes(needed_bytes)} "
            f"but only {human_bytes(available_bytes)} is free"
        )


class VerificationFailed(StagingError):
    """A staged file is missing, has the wrong size, or the safetensors index disagrees with the shards."""

    def __init__(self, folder: str, problems: list[str]) -> None:
        self.folder = folder
        self.problems = problems
        listed = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"model folder {folder} failed verification:\n{listed}")
