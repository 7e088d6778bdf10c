"""A stand-in for the upload path: records what the generation engine hands over."""

from __future__ import annotations

from inference.records import Completion, DeadLetter


class Recorder:
    def __init__(self) -> None:
        self.staged: list[Completion] = []
        self.dead: list[DeadLetter] = []

    def stage(self, completion: Completion) -> bool:
        self.staged.append(completion)
        return True

    def dead_letter(self, letter: DeadLetter) -> bool:
        self.dead.append(letter)
        return True
