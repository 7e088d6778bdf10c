"""A stand-in for the Celery dispatcher: records the messages the reconciler and batch tails send."""

from __future__ import annotations


class RecordingDispatcher:
    def __init__(self) -> None:
        self.generated: list[tuple[str, str]] = []
        self.resumed: list[tuple[str, str]] = []  # of those, sent before every batch not begun
        self.flushed: list[str] = []

    def generate(self, run: str, batch_id: str, *, countdown_s: float = 0.0, resumed: bool = False) -> None:
        self.generated.append((run, batch_id))
        if resumed:
            self.resumed.append((run, batch_id))

    def flush(self, run: str) -> None:
        self.flushed.append(run)
