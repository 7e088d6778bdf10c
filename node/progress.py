"""A rich progress bar for staging: bytes, speed and time left."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class RichStageProgress:
    """Implements staging.ProgressSink; safe to advance from boto3's transfer threads."""

    def __init__(self, description: str, console: Console | None = None) -> None:
        self.description = description
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.task: TaskID | None = None

    def begin(self, total_bytes: int, file_count: int) -> None:
        self.progress.start()
        self.task = self.progress.add_task(f"{self.description} ({file_count} files)", total=total_bytes)

    def advance(self, n_bytes: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n_bytes)

    def end(self) -> None:
        self.progress.stop()
