"""A stand-in for the upload path: records what the generation engine hands over."""

from __future__ import annotations

from collections.abc import Sequence

from core.records import Completion, DeadLetter, Turn
from workers.state.poison import Evidence


class Recorder:
    def __init__(self) -> None:
        self.staged: list[Completion] = []
        self.dead: list[DeadLetter] = []
        self.strikes: dict[str, list[Evidence]] = {}  # poison records, as Redis keeps them
        self.turns: dict[str, list[Turn]] = {}

    def stage(self, completion: Completion) -> bool:
        self.staged.append(completion)
        self.turns.pop(completion.prompt_id, None)
        return True

    def dead_letter(self, letter: DeadLetter) -> bool:
        self.dead.append(letter)
        return True

    def strike(self, prompt_id: str, event: Evidence) -> list[Evidence]:
        self.strikes.setdefault(prompt_id, []).append(event)
        return list(self.strikes[prompt_id])

    def strikes_of(self, prompt_ids: Sequence[str]) -> dict[str, list[Evidence]]:
        return {p: list(self.strikes[p]) for p in prompt_ids if p in self.strikes}

    def keep_turns(self, prompt_id: str, turns: list[Turn]) -> bool:
        self.turns[prompt_id] = list(turns)
        return True

    def kept_turns(self, prompt_ids: Sequence[str]) -> dict[str, list[Turn]]:
        return {p: list(self.turns[p]) for p in prompt_ids if p in self.turns}
