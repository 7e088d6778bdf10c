"""The records every package shares: prompts, batches, completions, dead letters.

Wire records never forbid unknown fields, so a newer producer can talk to an older worker.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

ASSISTANT_ROLE = "assistant"
TOKEN_ID_LIMIT = 2**31  # every vocabulary holds fewer entries: an id fits a 32-bit column

TokenId = Annotated[int, msgspec.Meta(ge=0, lt=TOKEN_ID_LIMIT)]


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every record: frozen, keyword-only."""


class Message(Record, frozen=True):
    role: str
    content: str


class SamplingSettings(Record, frozen=True):
    """Sent explicitly on every request: SGLang fills omitted fields from generation_config."""

    model: str = "default"
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    max_tokens: int = 32768
    enable_thinking: bool = True
    seed: int | None = None


def row_place(row: int, file: str) -> str:
    """Where a row is, as an editor takes it: `row 12` of one file, `shard-3.jsonl:12` in a folder."""
    return f"{file}:{row}" if file else f"row {row}"


class Turns(enum.StrEnum):
    """Which assistant turns of a conversation the target model writes (pinned with a run's settings)."""

    ALL = "all"  # every one, turn by turn, each request holding the answers regenerated before it
    LAST = "last"  # only the next one: one request, the history as the dataset gives it


class Prompt(Record, frozen=True, omit_defaults=True):
    """One row to answer. A conversation regenerated turn by turn (`Turns.ALL`, two user turns or more)
    holds its system and user messages only, the dataset's assistant turns left out, and `turn_ends`:
    where each turn's messages end (exclusive indexes into `messages`, the last one its length). Empty
    `turn_ends`: one request of `messages` as they are."""

    id: str
    messages: list[Message]
    row: int = 0  # 1-based row number in the source, for error messages
    file: str = ""  # the file inside a folder or S3 prefix the row is in; empty for a one-file source
    turn_ends: list[int] = []
    known_answer_chars: int = 0
    """The length of the dataset's own answers to the turns asked (0: it gives none): a hint of how long
    the work takes, for its order only (producer/enqueue/work_order.py)."""
    columns: dict[str, Any] = {}
    """The row's columns the run keeps (`--keep-columns`), by name, as JSON types them; they reach the
    completion as they are (core/kept_columns.py)."""

    def place(self) -> str:
        return row_place(self.row, self.file)

    @property
    def turn_count(self) -> int:
        """The requests this prompt takes: one per user turn regenerated."""
        return len(self.turn_ends) or 1

    def request_messages(self, answers: Sequence[str]) -> list[Message]:
        """The messages of the request for turn len(answers) + 1: this conversation's messages up to the
        end of that turn, each earlier turn followed by the answer regenerated for it."""
        if not self.turn_ends:
            return list(self.messages)
        messages: list[Message] = []
        start = 0
        for end, answer in zip(self.turn_ends, answers, strict=False):
            messages += [*self.messages[start:end], Message(role=ASSISTANT_ROLE, content=answer)]
            start = end
        return messages + self.messages[start : self.turn_ends[len(answers)]]


class PromptBatch(Record, frozen=True):
    run: str
    batch_id: str
    prompts: list[Prompt]


class Quality(enum.StrEnum):
    OK = "ok"
    TRUNCATED_IN_THINKING = "truncated_in_thinking"
    TRUNCATED_IN_ANSWER = "truncated_in_answer"
    EMPTY_ANSWER = "empty_answer"
    NO_REASONING = "no_reasoning"


class Usage(Record, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int


class Timings(Record, frozen=True):
    started_at: float  # unix seconds
    finished_at: float
    latency_s: float


class Origin(Record, frozen=True):
    """Where a completion was generated. `server` names the server's facts (version, model path,
    speculative settings, context length) recorded once per server in the output's `servers/`."""

    host: str
    gpu: int | None
    server_url: str
    server: str | None = None


class Answer(Record, frozen=True, kw_only=True):
    """What the server answered to one request: the text, how it ended, what it cost, the exact ids."""

    reasoning_content: str | None
    content: str
    finish_reason: str
    usage: Usage
    spec_accept_length: float | None = None
    # The exact ids the server tokenized and sampled (SGLang's `return_token_ids`): the chat template
    # applied to the prompt, then every generated token, thinking and `</think>` and EOS included.
    # None when the server does not return them (SGLang before 0.5.23).
    prompt_token_ids: list[TokenId] | None = None
    response_token_ids: list[TokenId] | None = None


class KeptAnswer(Answer, frozen=True, kw_only=True):
    """An answer as a run keeps it: judged, timed, and which attempt gave it."""

    quality: Quality
    timings: Timings
    attempt: int
    budget_retries: int = 0  # times the budget was doubled after thinking was cut off


def fields_of(record: msgspec.Struct, shape: type[msgspec.Struct]) -> dict[str, Any]:
    """The fields `record` has as a `shape` (a record it extends), by name: one record made from another
    without copying its fields by hand."""
    return {name: getattr(record, name) for name in shape.__struct_fields__}


class Turn(KeptAnswer, frozen=True, kw_only=True):
    """One generated assistant turn of a conversation before its last, as its own request answered it:
    the exact ids are that request's (its prompt holds the answers before it, not their thinking)."""

    max_tokens: int  # the budget this turn was answered with (budget retries double it)


class Completion(Record, frozen=True):
    """A prompt's answer. For a conversation regenerated turn by turn, it is the answer to the last
    request, whose `messages` hold the whole conversation before it (the regenerated answers in place);
    `earlier_turns` holds how each earlier turn was generated, and `conversation_turns` how many user
    turns the row has (more than the generated turns when one was truncated in thinking, which stops it).

    It holds every field of a `KeptAnswer` (tests/unit/test_records.py compares them, type and default),
    declared here rather than inherited so that the prompt's id leads its Parquet row and its JSON."""

    prompt_id: str
    messages: list[Message]
    reasoning_content: str | None
    content: str
    finish_reason: str
    quality: Quality
    usage: Usage
    timings: Timings
    model: str
    sampling: SamplingSettings
    origin: Origin
    attempt: int
    spec_accept_length: float | None = None
    budget_retries: int = 0
    prompt_token_ids: list[TokenId] | None = None
    response_token_ids: list[TokenId] | None = None
    earlier_turns: list[Turn] = []
    conversation_turns: int = 1
    columns: dict[str, Any] = {}  # the prompt's kept columns; in Parquet, a struct of the run's types

    @property
    def generated_turns(self) -> int:
        return len(self.earlier_turns) + 1

    def turns(self) -> list[Turn]:
        """Every generated turn in order, this completion's own answer last."""
        return [*self.earlier_turns, self.as_turn()]

    def as_turn(self) -> Turn:
        return Turn(**fields_of(self, KeptAnswer), max_tokens=self.sampling.max_tokens)

    def output_tokens(self) -> int:
        """The output tokens of every generated turn (what the run's stats and events count)."""
        return sum(turn.usage.completion_tokens for turn in self.turns())


class DeadLetterReason(enum.StrEnum):
    """Why a prompt will get no completion: a short, stable category (the message says the rest)."""

    REJECTED_BY_SERVER = "rejected_by_server"  # 400: over the context, bad values
    FAILED_EVERY_ATTEMPT = "failed_every_attempt"
    TRUNCATED_IN_THINKING = "truncated_in_thinking"  # the `drop` policy for thinking cut by the budget
    BATCH_FAILED = "batch_failed"  # its batch kept failing unexpectedly
    POISON_PROMPT = "poison_prompt"  # it hung or dropped every server it was sent to (see poison.py)
    RECORD_TOO_LARGE = "record_too_large"  # its completion is past the record limit (state/record_limits.py)


class DeadLetter(Record, frozen=True, omit_defaults=True):
    prompt_id: str
    row: int
    reason: str  # a DeadLetterReason value (kept a plain string on the wire for older readers)
    error: str  # the server's or client's message
    attempts: int
    file: str = ""  # the prompt's file in a folder or S3 prefix (Prompt.file)
    turn: int = 0  # the turn of a conversation that failed (1-based); 0 for a one-request prompt
