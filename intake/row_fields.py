"""Which fields of a row hold its conversation, its prompt, its system prompt and its id.

By default a row is read as the common dataset layouts name things (intake/rows.py): turns in `messages`
(OpenAI) or `conversations` (ShareGPT), else a `prompt` string; a `system` string; an id in `id`,
`custom_id` or `uuid`. A run whose dataset names them otherwise maps its own columns (`--prompt-field
question`, `--messages-field dialog`, `--system-field instruction`, `--id-field uid`): a mapped prompt or
messages field replaces every default one, so no other column is read as the prompt by surprise. A list
of turns in a shape of its own names its keys and role names (`--turn-keys speaker,text --roles
human=user,bot=assistant`). The columns a run keeps beside each completion (`--keep-columns`) are read too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from core.run_settings.model import KEEP_ALL_COLUMNS, RunSettings
from intake.prompt_ids import ID_FIELDS

MESSAGES_FIELD, CONVERSATIONS_FIELD, PROMPT_FIELD, SYSTEM_FIELD = (
    "messages",
    "conversations",
    "prompt",
    "system",
)
MAPPING_FLAGS = ("--prompt-field", "--messages-field")


@dataclass(frozen=True, slots=True)
class RowFields:
    """The fields a row is read from, in the order they are tried."""

    turns: tuple[str, ...] = (MESSAGES_FIELD, CONVERSATIONS_FIELD)  # a list of turns, OpenAI or ShareGPT
    prompt: tuple[str, ...] = (PROMPT_FIELD,)  # one user turn's text
    system: str = SYSTEM_FIELD
    ids: tuple[str, ...] = ID_FIELDS
    turn_keys: tuple[str, str] | None = None  # a turn's role key and text key; None: either usual shape
    roles: Mapping[str, str] | None = None  # the dataset's own role names -> system, user or assistant
    keep: tuple[str, ...] = ()  # the columns kept beside each completion; (KEEP_ALL_COLUMNS,): all unread

    @classmethod
    def mapped(
        cls,
        *,
        prompt: str | None = None,
        messages: str | None = None,
        system: str | None = None,
        id_field: str | None = None,
        turn_keys: tuple[str, str] | None = None,
        roles: Mapping[str, str] | None = None,
        keep: tuple[str, ...] | None = None,
    ) -> RowFields:
        """The default layout with the fields a run named in place of the defaults."""
        default = cls()
        mapped_format = prompt is not None or messages is not None
        return cls(
            turns=((messages,) if messages else ()) if mapped_format else default.turns,
            prompt=((prompt,) if prompt else ()) if mapped_format else default.prompt,
            system=system or default.system,
            ids=(id_field,) if id_field else default.ids,
            turn_keys=turn_keys,
            roles=roles,
            keep=keep or (),
        )

    @classmethod
    def of(cls, settings: RunSettings) -> RowFields:
        """The fields a run's rows are read from, as its settings say."""
        return cls.mapped(
            prompt=settings.prompt_field,
            messages=settings.messages_field,
            system=settings.system_field,
            id_field=settings.id_field,
            turn_keys=settings.turn_keys,
            roles=settings.roles,
            keep=settings.keep_columns,
        )

    @property
    def format_fields(self) -> tuple[str, ...]:
        """The fields that can make a row a prompt: a file with none of them has no prompt at all."""
        return (*self.turns, *self.prompt)

    @property
    def read(self) -> tuple[str, ...]:
        """Every field the prompt and its id are read from."""
        return (*self.format_fields, self.system, *self.ids)

    @property
    def keeps_all(self) -> bool:
        return self.keep == (KEEP_ALL_COLUMNS,)

    @property
    def wanted(self) -> tuple[str, ...] | None:
        """The columns to read of a Parquet or Arrow file: those read and those kept; None for all."""
        return None if self.keeps_all else (*self.read, *self.keep)

    def kept_columns(self, row: Mapping[str, object]) -> dict[str, object]:
        """The row's columns the run keeps (an absent one left out: it is null where it is kept)."""
        if self.keeps_all:
            return {name: value for name, value in row.items() if name not in self.read}
        return {name: row[name] for name in self.keep if name in row}

    def describe_format(self) -> str:
        """`messages, conversations or prompt`: the fields, as a sentence names them."""
        names = list(self.format_fields)
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


DEFAULT_ROW_FIELDS = RowFields()
