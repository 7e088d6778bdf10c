"""The records every package shares: prompts, batches, completions, dead letters.

Wire records never forbid unknown fields, so a newer producer can talk to an older worker.
"""

from __future__ import annotations

import enum

import msgspec


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


class Prompt(Record, frozen=True, omit_defaults=True):
    id: str
    messages: list[Message]
    row: int = 0  # 1-based row number in the source, for error messages
    file: str = ""  # the file inside a folder or S3 prefix the row is in; empty for a one-file source

    def place(self) -> str:
        return row_place(self.row, self.file)


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


class Completion(Record, frozen=True):
    prompt_id: str
    messages: list[Message]
    reasoning_content: str | None
    content: str
    finish_reason: str
    usage: Usage
    timings: Timings
    model: str
    sampling: SamplingSettings
    origin: Origin
    attempt: int
    quality: Quality
    spec_accept_length: float | None = None
    budget_retries: int = 0  # times the budget was doubled after thinking was cut off
    # The exact ids the server tokenized and sampled (SGLang's `return_token_ids`): the chat template
    # applied to the prompt, then every generated token, thinking and `</think>` and EOS included.
    # None when the server does not return them (SGLang before 0.5.23).
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None


class DeadLetterReason(enum.StrEnum):
    """Why a prompt will get no completion: a short, stable category (the message says the rest)."""

    REJECTED_BY_SERVER = "rejected_by_server"  # 400: over the context, bad values
    FAILED_EVERY_ATTEMPT = "failed_every_attempt"
    TRUNCATED_IN_THINKING = "truncated_in_thinking"  # the `drop` policy for thinking cut by the budget
    BATCH_FAILED = "batch_failed"  # its batch kept failing unexpectedly
    POISON_PROMPT = "poison_prompt"  # it hung or dropped every server it was sent to (see poison.py)


class DeadLetter(Record, frozen=True, omit_defaults=True):
    prompt_id: str
    row: int
    reason: str  # a DeadLetterReason value (kept a plain string on the wire for older readers)
    error: str  # the server's or client's message
    attempts: int
    file: str = ""  # the prompt's file in a folder or S3 prefix (Prompt.file)
