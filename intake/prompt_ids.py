"""Prompt ids: the row's own id when it has one, else a stable hash of its normalised messages.

Explicit ids come from the first of these fields that is present and not null: `id`, then
`custom_id` (OpenAI batch files), then `uuid` (or the one field a run maps with `--id-field`). A
string id is used exactly as written (it must hold a non-whitespace character and be at most
`MAX_ID_CHARS` long); an integer becomes its decimal string. Any other type is a rejection, never a
silent fall-back to the hash, because two runs of the same data must agree on every id.

Hashed ids are computed from the messages AFTER normalisation (rows.py: roles mapped to
system/user/assistant, text parts joined, trailing assistant turns dropped), so the same
conversation written as OpenAI `messages`, ShareGPT `conversations` or a `prompt` string gets the
same id. The recipe, reproducible in any language:

    canonical = JSON of [{"content": c, "role": r}, ...] with keys sorted, no whitespace
                between tokens, non-ASCII characters written as UTF-8 (not \\u escapes)
    id        = "h-" + sha256(canonical).hexdigest()[:32]

Contents are NOT stripped or Unicode-normalised: whitespace can matter (code, poems, a trailing
newline the model sees), so "hi" and "hi\\n" are two prompts with two ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from core.records import Message

ID_FIELDS = ("id", "custom_id", "uuid")
HASHED_ID_PREFIX = "h-"
HASHED_ID_HEX_CHARS = 32  # 128 bits: no collision in any realistic dataset
HEX_DIGITS = frozenset("0123456789abcdef")
MAX_ID_CHARS = 256  # ids are Redis set members and S3 record fields; a huge one is a broken row


class InvalidId(ValueError):
    """The row's explicit id cannot be used; the message names the field."""


def explicit_id(row: Mapping[str, object], fields: Iterable[str] = ID_FIELDS) -> str | None:
    """The row's own id, None when it has none, or InvalidId when the one it has is unusable."""
    for field in fields:
        value = row.get(field)
        if value is None:
            continue
        if isinstance(value, bool):
            raise InvalidId(f"{field}: must be a string or an integer, got bool")
        if isinstance(value, int):
            return str(value)
        if not isinstance(value, str):
            raise InvalidId(f"{field}: must be a string or an integer, got {type(value).__name__}")
        if not value.strip():
            raise InvalidId(f"{field}: is empty")
        if len(value) > MAX_ID_CHARS:
            raise InvalidId(f"{field}: is {len(value)} characters long, more than {MAX_ID_CHARS}")
        return value
    return None


def is_hashed_id(prompt_id: str) -> bool:
    """Whether an id has the form of a hashed one (a row's own id of that form is not to be expected)."""
    digest = prompt_id.removeprefix(HASHED_ID_PREFIX)
    return (
        len(prompt_id) == len(HASHED_ID_PREFIX) + HASHED_ID_HEX_CHARS
        and prompt_id.startswith(HASHED_ID_PREFIX)
        and all(char in HEX_DIGITS for char in digest)
    )


def hashed_id(messages: Sequence[Message]) -> str:
    """The stable id of a normalised conversation (recipe in the module docstring)."""
    # msgspec writes exactly the recipe's bytes (keys in this, sorted, order; json.dumps's escapes; UTF-8),
    # three times faster than json.dumps (tests/producer/test_producer_prompt_ids.py holds them equal)
    canonical = msgspec.json.encode(
        [{"content": message.content, "role": message.role} for message in messages]
    )
    digest = hashlib.sha256(canonical).hexdigest()
    return HASHED_ID_PREFIX + digest[:HASHED_ID_HEX_CHARS]
