"""Faults keyed by prompt content, for tests of poison prompts: every request whose messages contain a
substring is dropped, hangs, wedges or crashes the whole server, or is retracted under load, on every
server that has the fault, or only the next N such requests.

`{"<substring>": "drop" | "hang" | "wedge" | "crash"}`, or `{"<substring>": {"fault": "hang", "times": 1}}`
for the next N matching requests only (then the entry is spent and removed), or a retraction's pause
`{"<substring>": {"fault": "retract", "pause_s": 40}}`, or a crash's delay `{"<substring>": {"fault":
"crash", "after_s": 1}}`. Set at start with `--prompt-faults JSON`, or at run time as `prompt_faults` of
`POST /admin/faults`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec


class PromptFaultKind(enum.StrEnum):
    DROP = "drop"  # the connection is closed half-way through the request, as with --drop-rate
    HANG = "hang"  # admitted (a stream gets its first chunk), then nothing more: the slot stays held
    WEDGE = "wedge"  # the whole server hangs as it takes the request in: no token for anyone, /health 200
    CRASH = "crash"  # the server process dies (SIGKILL) as the request arrives, or `after_s` later
    RETRACT = "retract"  # under load, taken out after its first token for `pause_s`, then resumed


class PromptFault(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    fault: PromptFaultKind
    times: int | None = None  # the next N matching requests; None: every one
    pause_s: float | None = None  # a retracted request's silence, wall seconds (retract only)
    after_s: float | None = None  # a crash this many wall seconds after the request arrives (crash only)

    def problems(self, substring: str) -> list[str]:
        found = []
        if not substring:
            found.append("a prompt fault's substring must not be empty")
        if self.times is not None and self.times < 1:
            found.append(f"prompt fault {substring!r}: times must be at least 1 or null")
        retracts = self.fault is PromptFaultKind.RETRACT
        if retracts and (self.pause_s is None or self.pause_s <= 0):
            found.append(f"prompt fault {substring!r}: retract needs pause_s, a positive number of seconds")
        if not retracts and self.pause_s is not None:
            found.append(f"prompt fault {substring!r}: pause_s is for retract only")
        if self.after_s is not None and (self.fault is not PromptFaultKind.CRASH or self.after_s < 0):
            found.append(f"prompt fault {substring!r}: after_s is for crash only, and not negative")
        return found


PromptFaults = dict[str, PromptFault]
_Given = dict[str, PromptFault | PromptFaultKind]  # a bare kind is shorthand for every matching request


def normalised(given: Mapping[str, Any]) -> PromptFaults:
    """The faults as `PromptFault`s; raises msgspec.ValidationError on a bad shape or kind."""
    parsed = msgspec.convert(dict(given), _Given)
    return {
        substring: fault if isinstance(fault, PromptFault) else PromptFault(fault=fault)
        for substring, fault in parsed.items()
    }


def parse_prompt_faults(text: str | None) -> PromptFaults:
    """The `--prompt-faults` option: a JSON object as above. Raises ValueError saying what is wrong."""
    if not text:
        return {}
    try:
        given = msgspec.json.decode(text)
        if not isinstance(given, dict):
            raise ValueError("--prompt-faults must be a JSON object")
        faults = normalised(given)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ValueError(f"--prompt-faults: {error}") from error
    problems = [problem for substring, fault in faults.items() for problem in fault.problems(substring)]
    if problems:
        raise ValueError("; ".join(problems))
    return faults


def messages_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Every message's text (string contents and text parts), one message per line."""
    texts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                part["text"]
                for part in content
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            )
    return "\n".join(texts)
