"""One raw dataset row in, one `Prompt` or one `RejectedRow` out. Never raises for bad data.

Row formats, tried in this order; the first field that is present and not null decides (the fields are
the run's `RowFields`, intake/row_fields.py; these are the default names):
- `messages` or `conversations`: a list of turns, each in one of two shapes, told apart by the first
  turn's keys (a `from` key and no `role` is ShareGPT):
  - OpenAI: {role, content}. content is a string or a list of content parts; text parts are joined
    with nothing between them (as Qwen-style chat templates render a part list); any other part type
    (image_url, input_audio...) is rejected. Roles: system, user, assistant, and `developer`, OpenAI's
    newer name for the system role, which becomes `system` because chat templates of open models do
    not know it. tool/function turns are rejected.
  - ShareGPT: {from, value}; from is human/user -> user, gpt/assistant/chatgpt/bing -> assistant,
    system -> system.
  - the run's own (`--turn-keys speaker,text`): {speaker, text}, text as OpenAI's content, role names
    system, user and assistant.
  The run's own role names (`--roles human=user,bot=assistant`) join those of the shape.
- `prompt`: a non-empty string, becoming one user turn.
A row may also carry a `system` string (LLaMA-Factory's ShareGPT layout does): when non-empty it
becomes the first turn, unless the conversation already starts with that same system turn; a
different system turn in both places is a rejection rather than a guess.

Trailing assistant turns are dropped and what is left must end with a user turn. Then, by the run's
`Turns`: LAST, the model writes the next assistant turn to the history as given (one request); ALL,
the model writes every assistant turn: the dataset's assistant turns are left out, and the user turns
they followed mark where each of the conversation's turns ends (`Prompt.turn_ends`; consecutive user
turns are one turn, as they were one in the dataset). Every user turn must hold a non-whitespace
character; contents are otherwise kept exactly as written (see prompt_ids.py for why nothing is stripped).

Any text holding a NUL character (JSON's \\u0000) is a rejection: it is never meant as text.

A rejection reason reads "<field path>: <problem>", e.g. "messages[2].content: must be a string
or a list of content parts, got int".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from core.records import Message, Prompt, Turns
from intake.limits import MAX_CONTENT_PARTS, MAX_TURNS
from intake.prompt_ids import InvalidId, explicit_id, hashed_id
from intake.rejected import RejectedRow
from intake.row_fields import CONVERSATIONS_FIELD, DEFAULT_ROW_FIELDS, MAPPING_FLAGS, RowFields

SYSTEM, USER, ASSISTANT = "system", "user", "assistant"
SHAREGPT_ROLE_KEY, SHAREGPT_TEXT_KEY, OPENAI_ROLE_KEY, OPENAI_TEXT_KEY = "from", "value", "role", "content"
FIELDS_NAMED_AT_MOST = 8  # of a row without a prompt, the fields its rejection names
FIELD_NAME_CHARS_SHOWN = 40

OPENAI_ROLES = {SYSTEM: SYSTEM, "developer": SYSTEM, USER: USER, ASSISTANT: ASSISTANT}
SHAREGPT_ROLES = {
    SYSTEM: SYSTEM,
    "human": USER,
    USER: USER,
    "gpt": ASSISTANT,
    ASSISTANT: ASSISTANT,
    "chatgpt": ASSISTANT,
    "bing": ASSISTANT,
}
NAMED_ROLES = {SYSTEM: SYSTEM, USER: USER, ASSISTANT: ASSISTANT}  # a shape of the run's own: its names
USUAL_SHAPES = "a turn is {role, content} or ShareGPT {from, value}; --turn-keys ROLE,TEXT reads others"
TOOL_ROLES = frozenset({"tool", "function", "ipython", "function_call", "observation"})
TEXT_PART_TYPE = "text"
NUL = "\x00"


def rejection_key(source: str, rejected: RejectedRow) -> str:
    """The field of the run's `rejected` hash: one per row of one input."""
    return f"{source}|{rejected.file}|{rejected.row}"


def rejection_source(field: str, rejected: RejectedRow) -> str:
    """The input a `rejected` hash field names (the inverse of rejection_key)."""
    return field.removesuffix(f"|{rejected.file}|{rejected.row}")


class _Rejection(Exception):
    """Internal: carries a rejection reason out of the nested checks."""


def parse_row(
    raw: object,
    *,
    row: int,
    file: str = "",
    turns: Turns = Turns.LAST,
    fields: RowFields = DEFAULT_ROW_FIELDS,
) -> Prompt | RejectedRow:
    """Turn one decoded row into a prompt, or say by row number why it cannot be one. The id is the same
    whichever `turns`: it is the row's, hashed over the conversation as the dataset gives it."""
    try:
        if not isinstance(raw, dict):
            raise _Rejection(f"row: must be a JSON object, got {_type_name(raw)}")
        messages, last_answer_chars = _normalised_messages(raw, fields)
        prompt_id = explicit_id(raw, fields.ids) or hashed_id(messages)
        if NUL in prompt_id:
            raise _Rejection("id: holds a NUL character (\\u0000)")
    except (_Rejection, InvalidId) as rejection:
        return RejectedRow(row=row, reason=str(rejection), file=file)
    columns = _kept_values(raw, fields, row=row, file=file) if fields.keep else {}
    if isinstance(columns, RejectedRow):
        return columns
    if turns is Turns.LAST:
        return Prompt(
            id=prompt_id,
            messages=messages,
            row=row,
            file=file,
            known_answer_chars=last_answer_chars,
            columns=columns,
        )
    kept, turn_ends = turn_by_turn(messages)
    earlier_answer_chars = sum(len(m.content) for m in messages if m.role == ASSISTANT)
    return Prompt(
        id=prompt_id,
        messages=kept,
        row=row,
        file=file,
        turn_ends=turn_ends,
        known_answer_chars=earlier_answer_chars + last_answer_chars,
        columns=columns,
    )


def _kept_values(
    raw: Mapping[str, object], fields: RowFields, *, row: int, file: str
) -> dict[str, Any] | RejectedRow:
    """The kept columns' values as JSON types them (a Parquet date as its ISO-8601 text)."""
    try:
        values: dict[str, Any] = msgspec.to_builtins(fields.kept_columns(raw))
    except TypeError as error:
        return RejectedRow(
            row=row, reason=f"a kept column holds a value JSON cannot hold: {error}", file=file
        )
    return values


def turn_by_turn(messages: Sequence[Message]) -> tuple[list[Message], list[int]]:
    """A normalised conversation without its assistant turns, and where each of its turns ends (see
    `Prompt.turn_ends`; empty for one turn). A turn ends at a user turn the dataset answered, and last."""
    kept: list[Message] = []
    ends: list[int] = []
    for message in messages:
        if message.role != ASSISTANT:
            kept.append(message)
        elif kept and kept[-1].role == USER and (not ends or ends[-1] != len(kept)):
            ends.append(len(kept))
    ends.append(len(kept))
    return kept, ends if len(ends) > 1 else []


def _normalised_messages(row: Mapping[str, object], fields: RowFields) -> tuple[list[Message], int]:
    """The conversation up to its last user turn, and the length of the dataset's answer to that turn."""
    for field in fields.turns:
        if row.get(field) is not None:
            turns, content_path = _turns_of(row[field], field, fields)
            kept = _up_to_last_user_turn(turns, field, content_path)
            answer_chars = sum(len(turn.content) for turn in turns[len(kept) :])
            return _with_system_field(kept, row, fields.system), answer_chars
    for field in fields.prompt:
        if row.get(field) is not None:
            turns = [_prompt_turn(row[field], field)]
            return _with_system_field(_up_to_last_user_turn(turns, field, field), row, fields.system), 0
    raise _Rejection(no_prompt_reason(row, fields))


def no_prompt_reason(row: Mapping[str, object], fields: RowFields) -> str:
    """Why a row without any of the prompt fields is no prompt, naming the fields it has instead."""
    names = [name[:FIELD_NAME_CHARS_SHOWN] for name in list(row)[:FIELDS_NAMED_AT_MOST]]
    more = f" and {len(row) - len(names)} more" if len(row) > len(names) else ""
    has = f"its fields: {', '.join(names)}{more}" if names else "it has no fields"
    return f"no {fields.describe_format()} field ({has}; {' or '.join(MAPPING_FLAGS)} maps one)"


@dataclass(frozen=True)
class _TurnShape:
    """How a list's turns name their role and text, the role names they use, and how to say so."""

    role_key: str
    text_key: str
    roles: Mapping[str, str]
    text_of: Callable[[object, str], str]
    said: str  # ends a rejection of a turn that does not fit

    @classmethod
    def of(cls, fields: RowFields, sharegpt: bool) -> _TurnShape:
        """The run's own shape when it named one, else ShareGPT's or OpenAI's, with the run's role names."""
        own_roles = dict(fields.roles or {})
        if fields.turn_keys is not None:
            role_key, text_key = fields.turn_keys
            said = f"a turn is {{{role_key}, {text_key}}}, as --turn-keys says"
            return cls(role_key, text_key, {**NAMED_ROLES, **own_roles}, _content_text, said)
        if sharegpt:
            roles = {**SHAREGPT_ROLES, **own_roles}
            return cls(SHAREGPT_ROLE_KEY, SHAREGPT_TEXT_KEY, roles, _string, USUAL_SHAPES)
        return cls(
            OPENAI_ROLE_KEY, OPENAI_TEXT_KEY, {**OPENAI_ROLES, **own_roles}, _content_text, USUAL_SHAPES
        )


def _turns_of(value: object, field: str, fields: RowFields) -> tuple[list[Message], str]:
    """A list of turns in the run's shape or either usual one, and the path of a turn's text."""
    turns = _turn_list(value, field)
    first = turns[0][1]
    sharegpt_keys = (SHAREGPT_ROLE_KEY in first) + (SHAREGPT_TEXT_KEY in first)
    openai_keys = (OPENAI_ROLE_KEY in first) + (OPENAI_TEXT_KEY in first)
    sharegpt = sharegpt_keys > openai_keys or (sharegpt_keys == openai_keys and field == CONVERSATIONS_FIELD)
    shape = _TurnShape.of(fields, sharegpt)
    messages = [
        Message(
            role=_mapped_role(
                _required(turn, shape.role_key, path, shape.said), shape.roles, f"{path}.{shape.role_key}"
            ),
            content=shape.text_of(
                _required(turn, shape.text_key, path, shape.said), f"{path}.{shape.text_key}"
            ),
        )
        for path, turn in turns
    ]
    return messages, f"{field}[{{index}}].{shape.text_key}"


def _prompt_turn(value: object, field: str) -> Message:
    return Message(role=USER, content=_string(value, field))


def _turn_list(value: object, field: str) -> list[tuple[str, Mapping[str, object]]]:
    if not isinstance(value, list):
        raise _Rejection(f"{field}: must be a list of turns, got {_type_name(value)}")
    if not value:
        raise _Rejection(f"{field}: is empty")
    if len(value) > MAX_TURNS:
        raise _Rejection(f"{field}: holds {len(value):,} turns, more than {MAX_TURNS:,}")
    turns: list[tuple[str, Mapping[str, object]]] = []
    for index, turn in enumerate(value):
        path = f"{field}[{index}]"
        if not isinstance(turn, dict):
            raise _Rejection(f"{path}: must be an object, got {_type_name(turn)}")
        turns.append((path, turn))
    return turns


def _required(turn: Mapping[str, object], key: str, path: str, said: str) -> object:
    if key not in turn:
        raise _Rejection(f"{path}.{key}: is missing ({said})")
    value = turn[key]
    if value is None:
        raise _Rejection(f"{path}.{key}: is null")
    return value


def _mapped_role(value: object, roles: Mapping[str, str], path: str) -> str:
    role = _string(value, path)
    if role in roles:
        return roles[role]
    if role in TOOL_ROLES:
        raise _Rejection(f"{path}: is {role!r}; tool turns are not supported")
    raise _Rejection(f"{path}: {role!r} is not one of {', '.join(roles)} (--roles NAME=ROLE maps others)")


def _content_text(value: object, path: str) -> str:
    if isinstance(value, str):
        return _without_nul(value, path)
    if not isinstance(value, list):
        raise _Rejection(f"{path}: must be a string or a list of content parts, got {_type_name(value)}")
    if len(value) > MAX_CONTENT_PARTS:
        raise _Rejection(f"{path}: holds {len(value):,} content parts, more than {MAX_CONTENT_PARTS:,}")
    texts = []
    for index, part in enumerate(value):
        part_path = f"{path}[{index}]"
        if not isinstance(part, dict):
            raise _Rejection(f"{part_path}: must be a content part object, got {_type_name(part)}")
        part_type = part.get("type")
        if part_type != TEXT_PART_TYPE:
            raise _Rejection(f"{part_path}: is a {part_type!r} part; only text parts are supported")
        texts.append(_string(part.get("text"), f"{part_path}.text"))
    return "".join(texts)


def _string(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise _Rejection(f"{path}: must be a string, got {_type_name(value)}")
    return _without_nul(value, path)


def _without_nul(text: str, path: str) -> str:
    """A NUL character is never text: C-string layers (tokenizers, logs, terminals) cut it or the text."""
    position = text.find(NUL)
    if position >= 0:
        raise _Rejection(f"{path}: holds a NUL character (\\u0000) at character {position + 1}")
    return text


def _with_system_field(turns: list[Message], row: Mapping[str, object], field: str) -> list[Message]:
    system = row.get(field)
    if system is None:
        return turns
    text = _string(system, field)
    if not text:
        return turns
    system_turn = Message(role=SYSTEM, content=text)
    if turns[0].role != SYSTEM:
        return [system_turn, *turns]
    if turns[0] != system_turn:
        raise _Rejection(f"{field}: differs from the conversation's own system turn")
    return turns


def _up_to_last_user_turn(turns: Sequence[Message], field: str, content_path: str) -> list[Message]:
    """Drop the trailing assistant turns (the model writes the next one) and check what is left."""
    user_indexes = [index for index, turn in enumerate(turns) if turn.role == USER]
    if not user_indexes:
        raise _Rejection(f"{field}: has no user turn")
    for index in user_indexes:
        if not turns[index].content.strip():
            where = content_path.format(index=index)
            raise _Rejection(f"{where}: is empty")
    kept = list(turns)
    while kept[-1].role == ASSISTANT:
        kept.pop()
    if kept[-1].role != USER:
        raise _Rejection(
            f"{field}: ends with a {kept[-1].role} turn; the turn before the reply must be a user turn"
        )
    return kept


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__
