"""One committed `Completion` in, the JSON-ready row a drafter trainer reads out.

Formats (facts from the `specforge` 0.2.0 and `speculators` 0.9.0 wheels, paths inside them):

- `speculators`: `{"id", "input_ids", "loss_mask", "metadata"}`, the server's exact ids with loss 0
  over the prompt and 1 over every generated token, as speculators' own regenerator builds them
  (`cli/regenerate_responses.py` 319-329). A file whose columns include `input_ids` and `loss_mask`
  passes through unrendered (`data_generation/preprocessing.py` 603, 458-487): lengths must match,
  rows are cut to `--seq-length` (8192 by default, `cli/prepare_data.py` 95-98) and a row left with
  no supervised token is dropped (379-400); every other column is discarded (634). SpecForge reads
  the same rows as pre-tokenized prompts (`data.prompts_path`, `config/schema.py` 129-132;
  `data/prompt_builder.py` 62-83, 219-252), ignoring `id` and `metadata`.
- `specforge`: `{"id", "conversations": [{"role", "content", "reasoning_content"}, ...], "run",
  "part"}`, the shape of SpecForge's regenerator. Loaded with `load_dataset("json")`
  (`data/prompt_builder.py` 125) and re-tokenized with the target's chat template. Its thinking
  parser keeps `reasoning_content` on a turn and drops other turn keys (`data/parse.py` 40-47,
  470-477); the Qwen3 templates read `reasoning_content` only on assistant turns (`is string`), so
  it is null on the others. The loader pops `conversations`, `id` and `tools` and hands every other
  column to `tokenizer.apply_chat_template` as a keyword, i.e. a Jinja variable
  (`data/preprocessing.py` 258-294, `data/parse.py` 243, 483-490): `run` and `part` are inert for
  the Qwen templates, which is why nothing bigger rides along (and SpecForge's gpt-oss parser takes
  no extra keywords at all, `data/parse.py` 387-394). A run's kept input columns ride along the same
  way in every format; a name a chat template reads is refused at enqueue (core/run_settings/keys.py).
- `sharegpt`: `{"id", "conversations": [{"from", "value"}], "run", "part"}` with `from` one of
  system/human/gpt. With `ThinkingStyle.separate` the reasoning sits in `reasoning_content` beside
  `value`: ShareGPT has no thinking field of its own, and that is the key both trainers' ShareGPT
  normalizers read (SpecForge `data/parse.py` 105-117 keeps it, speculators
  `data_generation/preprocessing.py` 145 reads `thinking` or `reasoning_content`).
- `messages` (OpenAI): `{"id", "messages": [{"role", "content"[, "reasoning_content"]}], "run",
  "part"}`; `reasoning_content` is SGLang's and the Qwen chat templates' name.

Conversations regenerated turn by turn (`--turns all`, the default). Every assistant turn is the
target's, with its reasoning: `sharegpt` and `messages` emit the whole conversation in one row,
`reasoning_content` on every assistant turn (or `<think>` inlined on each with `--thinking tags`).
`specforge` emits one row per generated turn, `id` `<prompt id>/turn-<j>`, the conversation up to that
turn: SpecForge re-renders a row with its chat template, and the Qwen3 templates drop the thinking of
every turn before the last user turn, so a whole-conversation row would train the last turn's thinking
only (and, with `qwen3-thinking` and `train_only_last_turn: false`, earlier answers without theirs);
each per-turn row ends with its turn and that turn's reasoning, the earlier turns as the server was
given them, so `train_only_last_turn: true` trains every turn once, with its thinking.
`speculators` emits one row per generated turn, `id` `<prompt id>/turn-<j>`, each with the exact
ids of that turn's own request and loss 1 over that turn's generated ids: the turns' ids do not
concatenate into one sequence, because a later request holds the earlier answers without their
thinking (the Qwen3 templates drop it, so the server's prompt ids of turn j+1 are not turn j's prompt
and response ids), and a row whose loss spans tokens the server never sampled in that context would
train the drafter on a sequence the target did not produce.

Multi-turn prompts answered at the last turn only (`--turns last`). The completion is the last
assistant turn; earlier assistant turns come from the prompt and carry no reasoning (their
`reasoning_content` is ""). Qwen3 templates render an
assistant turn before the last user turn without a think block, so SpecForge's re-rendered context
equals what the server was given. SpecForge masks every assistant span its template's header and
end-of-turn match (`data/parse.py` 180-185, 282-314), unless `train_only_last_turn: true` keeps only
the last match (282-284; default false, `config/schema.py` 143). With the `qwen3.5` template the
header is `<|im_start|>assistant\n<think>\n` (`data/template.py` 361-371), which history turns
lack, so they are unmasked anyway; with `qwen3-thinking` (header `<|im_start|>assistant\n`,
194-204) the history answers WOULD be trained on. Each row here already is the expanded form that
SpecForge's `expand_reasoning_conversations.py` produces (one row per generated turn, ending with
it; the script is not in the wheel), so train with `train_only_last_turn: true` and skip the
expansion. Also: a conversation without a system turn gets the template's `system_prompt`
(`data/parse.py` 202-212): "" for `qwen3.5`, "You are a helpful assistant." for `qwen3-thinking`,
a system turn the server never saw.

Stable types. `load_dataset("json")` infers a schema per 10 MiB chunk and casts later chunks to the
first one (verified with datasets 5.2 / pyarrow 26): a field null throughout a chunk and a number in
a later one fails ("Couldn't cast array of type double to null"), an int chunk then a float fails,
and a turn key missing in one chunk and present in another fails. So every row of a format has the
same keys with the same types: turn keys are the same on every turn, float settings are written as
floats, and the two numbers that may be unknown are written with a sentinel instead of null:
`spec_accept_length` 0.0 (a measured accept length is at least 1) and `sampling.seed` -1.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from core.kept_columns import input_values
from core.records import Completion, Quality
from inference.quality import FINISH_LENGTH
from intake.rows import ASSISTANT, SYSTEM, USER
from producer.export.errors import MissingTokenIds, UnknownRole

Row = dict[str, Any]  # JSON-ready: str, int, float, bool, None, lists and dicts of them
TokenCounter = Callable[[str], int]  # text -> its number of tokens under the target's tokenizer

# Qwen3 chat templates render the last assistant turn as
# '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n').
THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
TEMPLATE_STRIPPED = "\n"
END_OF_TURN = "<|im_end|>"  # Qwen's EOS: the last id the server samples on a finished answer
THINK_MARKERS = ("<think>", "</think>")

REASONING_FIELD = "reasoning_content"
NO_ACCEPT_LENGTH = 0.0  # the server reported no speculative accept length (measured ones are >= 1)
NO_SEED = -1  # the request carried no seed
PROMPT_LOSS, RESPONSE_LOSS = 0, 1
SHAREGPT_ROLES = {SYSTEM: "system", USER: "human", ASSISTANT: "gpt"}


class ExportFormat(enum.StrEnum):
    SPECFORGE = "specforge"
    SPECULATORS = "speculators"
    SHAREGPT = "sharegpt"
    MESSAGES = "messages"


class ThinkingStyle(enum.StrEnum):
    """Where the reasoning goes in `sharegpt` and `messages` rows."""

    TAGS = "tags"  # inlined before the answer, as the Qwen3 chat template renders it
    SEPARATE = "separate"  # a `reasoning_content` field beside the answer


class LossSource(enum.StrEnum):
    """How a loss-token count was obtained, from exact to estimated."""

    IDS = "ids"  # the server's response ids
    TOKENIZER = "tokenizer"  # the generated text counted with the caller's tokenizer
    USAGE = "usage"  # the server's `usage.completion_tokens`


@dataclass(frozen=True)
class RowSource:
    """Where a row came from: with the row's id (the prompt id), every row is attributable."""

    run: str
    part: str  # object key of the Parquet part holding the completion
    column_types: Mapping[str, str] | None = None  # the run's kept columns, written in each of its rows


@dataclass(frozen=True)
class LossCount:
    count: int  # loss-bearing tokens of the row
    source: LossSource


def render(
    completion: Completion,
    fmt: ExportFormat,
    *,
    source: RowSource,
    thinking: ThinkingStyle = ThinkingStyle.SEPARATE,
) -> list[Row]:
    """The rows `fmt`'s trainer reads for `completion`: one, or for `speculators` one per generated
    turn of a conversation (see the module docstring).

    `thinking` applies to `sharegpt` and `messages`; `specforge` always keeps `reasoning_content`
    apart, `speculators` carries ids. Raises `MissingTokenIds` for `speculators` when the server
    returned no ids, `UnknownRole` for a role the format cannot name.
    """
    fmt = ExportFormat(fmt)
    if fmt is ExportFormat.SPECULATORS:
        rows = _rows_per_turn(
            completion, lambda turn, row_id, number: _speculators_row(turn, row_id, source, number=number)
        )
    elif fmt is ExportFormat.SPECFORGE:
        rows = _rows_per_turn(
            completion,
            lambda turn, row_id, _: _text_row(
                turn, "conversations", _role_turns(turn, ThinkingStyle.SEPARATE), source, row_id
            ),
        )
    else:
        rows = [_conversation_row(completion, fmt, source=source, thinking=ThinkingStyle(thinking))]
    if not source.column_types:
        return rows
    kept = input_values(completion.columns, source.column_types)
    return [{**row, **kept} for row in rows]


def _rows_per_turn(completion: Completion, row_of: Callable[[Completion, str, int], Row]) -> list[Row]:
    """One row per generated turn, each the completion of that turn's own request: a one-request
    completion's row has its prompt id (turn 0), a conversation's `<prompt id>/turn-<j>` (turn j)."""
    turns = turn_completions(completion)
    if len(turns) == 1:
        return [row_of(completion, completion.prompt_id, 0)]
    return [
        row_of(turn, f"{completion.prompt_id}/turn-{number}", number)
        for number, turn in enumerate(turns, start=1)
    ]


def _conversation_row(
    completion: Completion, fmt: ExportFormat, *, source: RowSource, thinking: ThinkingStyle
) -> Row:
    if fmt is ExportFormat.MESSAGES:
        return _text_row(completion, "messages", _role_turns(completion, thinking), source)
    return _text_row(completion, "conversations", _sharegpt_turns(completion, thinking), source)


def think_tagged(reasoning: str | None, content: str) -> str:
    """The answer with its reasoning inlined the way Qwen3 templates render the last turn."""
    thought = (reasoning or "").strip(TEMPLATE_STRIPPED)
    return THINK_OPEN + thought + THINK_CLOSE + content.lstrip(TEMPLATE_STRIPPED)


def raw_think_markers(completion: Completion) -> bool:
    """An answer or a reasoning of any generated turn holds a literal `<think>`/`</think>`: SpecForge's
    regenerator skips such rows (a re-rendered template would split them wrongly), so an export drops
    them."""
    texts = [text for turn in completion.turns() for text in (turn.content, turn.reasoning_content or "")]
    return any(marker in text for text in texts for marker in THINK_MARKERS)


def turn_completions(completion: Completion) -> list[Completion]:
    """Each generated turn as the completion of its own request, in order: its messages are the
    conversation up to that turn's user turn, its answer, ids, usage and budget the turn's. A
    one-request completion is its own single turn."""
    if not completion.earlier_turns:
        return [completion]
    answers = [index for index, message in enumerate(completion.messages) if message.role == ASSISTANT]
    return [
        msgspec.structs.replace(
            completion,
            messages=completion.messages[:answer_at],
            reasoning_content=turn.reasoning_content,
            content=turn.content,
            finish_reason=turn.finish_reason,
            quality=turn.quality,
            usage=turn.usage,
            timings=turn.timings,
            sampling=msgspec.structs.replace(completion.sampling, max_tokens=turn.max_tokens),
            attempt=turn.attempt,
            budget_retries=turn.budget_retries,
            spec_accept_length=turn.spec_accept_length,
            prompt_token_ids=turn.prompt_token_ids,
            response_token_ids=turn.response_token_ids,
            earlier_turns=[],
        )
        for answer_at, turn in zip(answers, completion.earlier_turns, strict=True)
    ] + [msgspec.structs.replace(completion, earlier_turns=[])]


def loss_tokens(completion: Completion, tokenizer: TokenCounter | None = None) -> LossCount:
    """Tokens the trainer computes loss on for this row.

    The response ids are the loss-bearing span for both trainers. speculators puts loss 1 on every
    generated id. SpecForge's `qwen3.5` mask runs from after `<|im_start|>assistant\\n<think>\\n`
    (the end of the server's prompt ids, whose generation prompt is that same text) through
    `<|im_end|>`, i.e. reasoning, `</think>`, answer and EOS: the generated ids. SpecForge's span
    also takes the newline the template puts after `<|im_end|>` (its end-of-turn token is
    `<|im_end|>\\n`), one token more, and a re-tokenized text may split slightly differently.

    Without ids, `tokenizer` (text -> token count) counts the generated text rebuilt from the
    reasoning, the answer and the template's closing text; failing that, `usage.completion_tokens`.
    """
    if completion.response_token_ids is not None:
        return LossCount(len(completion.response_token_ids), LossSource.IDS)
    if tokenizer is not None:
        return LossCount(tokenizer(generated_text(completion)), LossSource.TOKENIZER)
    return LossCount(completion.usage.completion_tokens, LossSource.USAGE)


def prompt_tokens(completion: Completion) -> int:
    """The row's prompt tokens: from the ids where present, else from usage."""
    ids = completion.prompt_token_ids
    return completion.usage.prompt_tokens if ids is None else len(ids)


def response_tokens(completion: Completion) -> int:
    """The row's response tokens: from the ids where present, else from usage."""
    ids = completion.response_token_ids
    return completion.usage.completion_tokens if ids is None else len(ids)


def sequence_tokens(completion: Completion) -> int:
    """Prompt and response tokens of the row."""
    return prompt_tokens(completion) + response_tokens(completion)


def generated_text(completion: Completion) -> str:
    """The text the server generated after its prompt, closing tokens included.

    With thinking on, the prompt ends with `<think>\\n`: the model writes its reasoning, then
    `\\n</think>\\n\\n`, the answer and `<|im_end|>`. With thinking off the empty think block is in
    the prompt. A budget hit (`length`) stops before `<|im_end|>`, and before `</think>` when it
    fell inside the thinking.
    """
    finished = completion.finish_reason != FINISH_LENGTH
    closing = END_OF_TURN if finished else ""
    if not completion.sampling.enable_thinking:
        return completion.content + closing
    thought = (completion.reasoning_content or "").strip(TEMPLATE_STRIPPED)
    if completion.quality is Quality.TRUNCATED_IN_THINKING:
        return thought
    return thought + THINK_CLOSE + completion.content.lstrip(TEMPLATE_STRIPPED) + closing


def _speculators_row(completion: Completion, row_id: str, source: RowSource, *, number: int = 0) -> Row:
    """`number`: the turn of a conversation this row is (its metadata says so), 0 for a one-request row."""
    prompt_ids, response_ids = completion.prompt_token_ids, completion.response_token_ids
    if prompt_ids is None or response_ids is None:
        raise MissingTokenIds(
            f"completion {row_id!r} has no token ids (the server returned none: "
            "SGLang before 0.5.23, or `return_token_ids` not asked for); the speculators format "
            "needs them, the specforge format does not"
        )
    return {
        "id": row_id,
        "input_ids": [*prompt_ids, *response_ids],
        "loss_mask": [PROMPT_LOSS] * len(prompt_ids) + [RESPONSE_LOSS] * len(response_ids),
        "metadata": _metadata(completion, source) | {"turn": number},
    }


def _metadata(completion: Completion, source: RowSource) -> Row:
    usage, sampling = completion.usage, completion.sampling
    accept = completion.spec_accept_length
    return {
        "finish_reason": completion.finish_reason,
        "quality": Quality(completion.quality).value,
        "usage": {
            "prompt_tokens": int(usage.prompt_tokens),
            "completion_tokens": int(usage.completion_tokens),
            "reasoning_tokens": int(usage.reasoning_tokens),
        },
        "model": completion.model,
        "sampling": {
            "model": sampling.model,
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "top_k": int(sampling.top_k),
            "min_p": float(sampling.min_p),
            "max_tokens": int(sampling.max_tokens),
            "enable_thinking": bool(sampling.enable_thinking),
            "seed": NO_SEED if sampling.seed is None else int(sampling.seed),
        },
        "run": source.run,
        "part": source.part,
        "budget_retries": int(completion.budget_retries),
        "spec_accept_length": NO_ACCEPT_LENGTH if accept is None else float(accept),
    }


def _text_row(
    completion: Completion, field: str, turns: list[Row], source: RowSource, row_id: str | None = None
) -> Row:
    return {"id": row_id or completion.prompt_id, field: turns, "run": source.run, "part": source.part}


def _reply(completion: Completion, thinking: ThinkingStyle) -> tuple[str, str]:
    """The generated turn's (content, reasoning) in the asked style."""
    if thinking is ThinkingStyle.TAGS:
        return think_tagged(completion.reasoning_content, completion.content), ""
    return completion.content, completion.reasoning_content or ""


def _history_reasoning(role: str) -> str | None:
    # "" on assistant turns (a string, as the templates expect there), null where it does not apply.
    return "" if role == ASSISTANT else None


def _role_turns(completion: Completion, thinking: ThinkingStyle) -> list[Row]:
    """The conversation's turns. The assistant turns of the messages are the regenerated earlier turns
    when there are some (each with its reasoning), else history from the dataset (none)."""
    separate = thinking is ThinkingStyle.SEPARATE
    earlier = iter(turn_completions(completion)[:-1])
    turns: list[Row] = []
    for message in completion.messages:
        generated = next(earlier) if message.role == ASSISTANT and completion.earlier_turns else None
        reasoning: str | None
        if generated is not None:
            content, reasoning = _reply(generated, thinking)
            turn: Row = {"role": ASSISTANT, "content": content}
        else:
            turn = {"role": message.role, "content": message.content}
            reasoning = _history_reasoning(message.role)
        if separate:
            turn[REASONING_FIELD] = reasoning
        turns.append(turn)
    content, reply_reasoning = _reply(completion, thinking)
    reply: Row = {"role": ASSISTANT, "content": content}
    if separate:
        reply[REASONING_FIELD] = reply_reasoning
    return [*turns, reply]


def _sharegpt_turns(completion: Completion, thinking: ThinkingStyle) -> list[Row]:
    return [
        {"from": _sharegpt_role(completion, turn["role"]), "value": turn["content"]}
        | ({REASONING_FIELD: turn[REASONING_FIELD]} if REASONING_FIELD in turn else {})
        for turn in _role_turns(completion, thinking)
    ]


def _sharegpt_role(completion: Completion, role: str) -> str:
    if role not in SHAREGPT_ROLES:
        raise UnknownRole(
            f"completion {completion.prompt_id!r}: role {role!r} has no ShareGPT name "
            f"(known: {', '.join(SHAREGPT_ROLES)})"
        )
    return SHAREGPT_ROLES[role]
