"""A stand-in for the upload path: records what the generation engine hands over."""

from __future__ import annotations

from collections.abc import Sequence

from inference.records import Completion, DeadLetter
from workers.state.poison import Strike


class Recorder:
    def __init__(self) -> None:
        self.staged: list[Completion] = []
        self.dead: list[DeadLetter] = []
        self.strikes: dict[str, list[Strike]] = {}

    def stage(self, completion: Completion) -> bool:
        self.staged.append(completion)
        return True

    def dead_letter(self, letter: DeadLetter) -> bool:
        self.dead.append(letter)
        return True

    def strike(self, prompt_id: str, strike: Strike) -> list[Strike]:
        self.strikes.setdefault(prompt_id, []).append(strike)
        return list(self.strikes[prompt_id])

    def strikes_of(self, prompt_ids: Sequence[str]) -> dict[str, list[Strike]]:
        return {p: list(self.strikes[p]) for p in prompt_ids if p in self.strikes}
