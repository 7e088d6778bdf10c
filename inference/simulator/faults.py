"""Faults on demand: injected errors, hangs, dropped connections, a crash, a whole-server hang, a server
that crashes every so often, and faults keyed by prompt content (`prompt_faults.py`).

Set at start from the settings; switched at run time through `POST /admin/faults`. Each chat request
draws its fate once: from its prompt's fault if its messages match one, else from a seeded generator
(independent of the thinking model, so faults never change what a prompt generates).
"""

from __future__ import annotations

import enum
import logging
import os
import random
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from inference.simulator.prompt_faults import (
    PromptFault,
    PromptFaultKind,
    PromptFaults,
    messages_text,
    normalised,
    parse_prompt_faults,
)
from inference.simulator.settings import ERROR_STATUS_CHOICES, SimulatorSettings

FAULT_SEED_SALT = 0x5EED_FA17
CRASH_LOG_MESSAGE = "Simulated crash: SIGKILL after %d chat requests"
PROMPT_CRASH_LOG_MESSAGE = "Simulated crash: SIGKILL on a prompt with a crash fault"
FLAKY_CRASH_LOG_MESSAGE = "Simulated crash: SIGKILL %g s after start (--crash-every-s)"


def die(message: str, *args: object) -> None:
    """End the process as a crashed server does: no response, no cleanup (SIGKILL)."""
    logging.getLogger(__name__).error(message, *args)
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class Faults(msgspec.Struct, kw_only=True, frozen=True):
    """The fault switches; the body of `GET /admin/faults` and (partially) of `POST /admin/faults`."""

    error_rate: float = 0.0
    error_status: int = 500
    hang_rate: float = 0.0
    drop_rate: float = 0.0
    crash_after_requests: int | None = None  # the process dies when chat request N+1 arrives
    server_hang: bool = False
    prompt_faults: dict[str, PromptFault] = msgspec.field(default_factory=dict)

    def problems(self) -> list[str]:
        found = [
            f"{name} must be in [0, 1]"
            for name in ("error_rate", "hang_rate", "drop_rate")
            if not 0.0 <= getattr(self, name) <= 1.0
        ]
        if self.error_rate + self.hang_rate + self.drop_rate > 1.0:
            found.append("error_rate + hang_rate + drop_rate must not exceed 1")
        if self.error_status not in ERROR_STATUS_CHOICES:
            found.append("error_status must be 500 or 503")
        if self.crash_after_requests is not None and self.crash_after_requests < 0:
            found.append("crash_after_requests must be non-negative or null")
        for substring, fault in self.prompt_faults.items():
            found.extend(fault.problems(substring))
        return found

    @classmethod
    def from_settings(cls, settings: SimulatorSettings) -> Faults:
        return cls(
            error_rate=settings.error_rate,
            error_status=settings.error_status,
            hang_rate=settings.hang_rate,
            drop_rate=settings.drop_rate,
            crash_after_requests=settings.crash_after_requests,
            server_hang=settings.server_hang,
            prompt_faults=parse_prompt_faults(settings.prompt_faults),
        )


class Fate(enum.Enum):
    NORMAL = "normal"
    ERROR = "error"
    HANG = "hang"  # never answered, never admitted
    DROP = "drop"
    STALL = "stall"  # admitted, its first token (a stream's first chunk), then nothing: the slot held
    WEDGE = "wedge"  # the server hangs as it takes the request in (as `server_hang`)
    CRASH = "crash"  # the process dies as the request arrives
    RETRACT = "retract"  # under load, taken out after its first token for a pause, then resumed


_PROMPT_FATES = {
    PromptFaultKind.DROP: Fate.DROP,
    PromptFaultKind.HANG: Fate.STALL,
    PromptFaultKind.WEDGE: Fate.WEDGE,
    PromptFaultKind.CRASH: Fate.CRASH,
    PromptFaultKind.RETRACT: Fate.RETRACT,
}


class Drawn(msgspec.Struct, frozen=True):
    """A chat request's fate; a retracted one's pause, a crash's delay, in wall seconds."""

    fate: Fate
    pause_s: float = 0.0
    after_s: float = 0.0  # a crash this long after the request arrived


class FaultController:
    """Holds the current faults, counts chat requests for the crash, and draws each request's fate."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self._rng = random.Random(settings.seed ^ FAULT_SEED_SALT)
        self._received = 0
        self.faults = Faults.from_settings(settings)
        self._crash_after = (
            self._received + self.faults.crash_after_requests
            if self.faults.crash_after_requests is not None
            else None
        )

    @property
    def received(self) -> int:
        return self._received

    def update(self, changes: dict[str, Any]) -> Faults:
        """Apply a partial update; raises ValueError (unknown key, bad value). Crash counts restart;
        `prompt_faults`, when given, replaces every prompt fault."""
        unknown = set(changes) - set(Faults.__struct_fields__)
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        merged = msgspec.to_builtins(self.faults) | changes
        try:
            if isinstance(merged["prompt_faults"], Mapping):
                merged["prompt_faults"] = msgspec.to_builtins(normalised(merged["prompt_faults"]))
            faults = msgspec.convert(merged, Faults)
        except msgspec.ValidationError as exc:
            raise ValueError(str(exc)) from exc
        problems = faults.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.faults = faults
        if "crash_after_requests" in changes:
            self._crash_after = (
                None if faults.crash_after_requests is None else self._received + faults.crash_after_requests
            )
        return faults

    def on_chat_request(self) -> None:
        """Count a chat request; die like a SIGKILLed server once the crash count is passed."""
        self._received += 1
        if self._crash_after is not None and self._received > self._crash_after:
            die(CRASH_LOG_MESSAGE, self._received - 1)

    def draw(self, messages: Sequence[Mapping[str, Any]]) -> Drawn:
        prompt_fate = self._prompt_fate(messages)
        if prompt_fate is not None:
            return prompt_fate
        faults = self.faults
        if not (faults.error_rate or faults.hang_rate or faults.drop_rate):
            return Drawn(Fate.NORMAL)
        draw = self._rng.random()
        for fate, rate in (
            (Fate.ERROR, faults.error_rate),
            (Fate.HANG, faults.hang_rate),
            (Fate.DROP, faults.drop_rate),
        ):
            if draw < rate:
                return Drawn(fate)
            draw -= rate
        return Drawn(Fate.NORMAL)

    def _prompt_fate(self, messages: Sequence[Mapping[str, Any]]) -> Drawn | None:
        """The fate of the first prompt fault whose substring is in the messages, spending one of its
        times; None when none matches."""
        if not self.faults.prompt_faults:
            return None
        text = messages_text(messages)
        for substring, fault in self.faults.prompt_faults.items():
            if substring in text:
                self._spend(substring, fault)
                return Drawn(_PROMPT_FATES[fault.fault], fault.pause_s or 0.0, fault.after_s or 0.0)
        return None

    def _spend(self, substring: str, fault: PromptFault) -> None:
        if fault.times is None:
            return
        remaining: PromptFaults = dict(self.faults.prompt_faults)
        if fault.times > 1:
            remaining[substring] = msgspec.structs.replace(fault, times=fault.times - 1)
        else:
            del remaining[substring]
        self.faults = msgspec.structs.replace(self.faults, prompt_faults=remaining)
