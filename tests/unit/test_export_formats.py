"""Export rows: what each drafter trainer reads from one committed completion.

Checked against the trainers' documented schemas (SpecForge 0.2.0, speculators 0.9.0) and by
loading written rows with `datasets.load_dataset("json")`, as both trainers do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets as hf_datasets
import msgspec
import pytest

from core.records import Completion, Message, Origin, Quality, SamplingSettings, Timings, Usage
from producer.errors import ProducerError
from producer.export.errors import ExportError, MissingTokenIds, UnknownRole
from producer.export.formats import (
    NO_ACCEPT_LENGTH,
    NO_SEED,
    ExportFormat,
    LossSource,
    RowSource,
    ThinkingStyle,
    TokenCounter,
    loss_tokens,
    raw_think_markers,
    render,
    sequence_tokens,
    turn_completions,
)

SOURCE = RowSource(run="run-a", part="runs/run-a/data/part-00007.parquet")
PROMPT_IDS = [151644, 872, 198, 3838, 151645, 198, 151644, 77091, 198, 151667, 198]
RESPONSE_IDS = [785, 4226, 13, 198, 151668, 271, 19, 17, 151645]
# A small chunk forces datasets to infer the schema on the first rows and cast every later chunk to
# it, as its default 10 MiB chunk does over a large export.
SMALL_CHUNK_BYTES = 1024
ROWS_PER_FILE = 24


def completion(
    prompt_id: str = "p-1",
    *,
    messages: list[Message] | None = None,
    reasoning: str | None = "\nLet me think.\n",
    content: str = "\n\nThe answer is 42.",
    quality: Quality = Quality.OK,
    finish_reason: str = "stop",
    with_ids: bool = True,
    spec_accept_length: float | None = 2.5,
    seed: int | None = 7,
    enable_thinking: bool = True,
) -> Completion:
    return Completion(
        prompt_id=prompt_id,
        messages=messages or [Message(role="user", content=f"question {prompt_id}")],
        reasoning_content=reasoning,
        content=content,
        finish_reason=finish_reason,
        usage=Usage(prompt_tokens=len(PROMPT_IDS), completion_tokens=40, reasoning_tokens=30),
        timings=Timings(started_at=1.0, finished_at=2.0, latency_s=1.0),
        model="qwen3.6-27b",
        sampling=SamplingSettings(model="qwen3.6-27b", seed=seed, enable_thinking=enable_thinking),
        origin=Origin(host="h", gpu=0, server_url="http://127.0.0.1:30000"),
        attempt=1,
        quality=quality,
        spec_accept_length=spec_accept_length,
        budget_retries=1,
        prompt_token_ids=list(PROMPT_IDS) if with_ids else None,
        response_token_ids=list(RESPONSE_IDS) if with_ids else None,
    )


MULTI_TURN = [
    Message(role="system", content="You are terse."),
    Message(role="user", content="hi"),
    Message(role="assistant", content="Hello."),
    Message(role="user", content="what is 6*7?"),
]


def test_speculators_rows_mask_exactly_the_response() -> None:
    [row] = render(completion(), ExportFormat.SPECULATORS, source=SOURCE)
    assert row["input_ids"] == PROMPT_IDS + RESPONSE_IDS
    assert row["loss_mask"] == [0] * len(PROMPT_IDS) + [1] * len(RESPONSE_IDS)
    assert sum(row["loss_mask"]) == loss_tokens(completion()).count


def test_speculators_rows_say_where_they_came_from_and_how_they_ended() -> None:
    [row] = render(completion("p-9"), ExportFormat.SPECULATORS, source=SOURCE)
    assert set(row) == {"id", "input_ids", "loss_mask", "metadata"}
    assert row["id"] == "p-9"
    meta = row["metadata"]
    assert (meta["run"], meta["part"]) == (SOURCE.run, SOURCE.part)
    assert (meta["finish_reason"], meta["quality"], meta["model"]) == ("stop", "ok", "qwen3.6-27b")
    assert meta["usage"] == {
        "prompt_tokens": len(PROMPT_IDS),
        "completion_tokens": 40,
        "reasoning_tokens": 30,
    }
    assert (meta["budget_retries"], meta["spec_accept_length"], meta["sampling"]["seed"]) == (1, 2.5, 7)
    assert json.loads(json.dumps(row)) == row


def test_speculators_export_without_token_ids_is_refused_naming_the_prompt() -> None:
    with pytest.raises(MissingTokenIds, match="p-old") as raised:
        render(completion("p-old", with_ids=False), ExportFormat.SPECULATORS, source=SOURCE)
    assert isinstance(raised.value, ExportError)
    assert isinstance(raised.value, ProducerError)


def test_unknown_speculative_figures_are_written_with_a_stable_type_not_null() -> None:
    [row] = render(completion(spec_accept_length=None, seed=None), ExportFormat.SPECULATORS, source=SOURCE)
    assert row["metadata"]["spec_accept_length"] == NO_ACCEPT_LENGTH
    assert isinstance(row["metadata"]["spec_accept_length"], float)
    assert row["metadata"]["sampling"]["seed"] == NO_SEED


def test_specforge_rows_keep_the_reasoning_apart_on_the_generated_turn() -> None:
    [row] = render(completion(), ExportFormat.SPECFORGE, source=SOURCE, thinking=ThinkingStyle.TAGS)
    assert set(row) == {"id", "conversations", "run", "part"}
    user, reply = row["conversations"]
    assert user == {"role": "user", "content": "question p-1", "reasoning_content": None}
    assert reply == {
        "role": "assistant",
        "content": "\n\nThe answer is 42.",
        "reasoning_content": "\nLet me think.\n",
    }


EARLIER_PROMPT_IDS = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198, 151667, 198]
EARLIER_RESPONSE_IDS = [32313, 151668, 271, 9707, 13, 151645]


def regenerated_conversation(prompt_id: str = "c-1") -> Completion:
    """A conversation of two turns regenerated turn by turn: the earlier answer is the target's."""
    last = completion(prompt_id, messages=MULTI_TURN)
    earlier = msgspec.structs.replace(
        last,
        reasoning_content="\nA greeting.\n",
        content="Hello.",
        prompt_token_ids=EARLIER_PROMPT_IDS,
        response_token_ids=EARLIER_RESPONSE_IDS,
        budget_retries=0,
    ).as_turn()
    return msgspec.structs.replace(last, earlier_turns=[earlier], conversation_turns=2)


def test_a_regenerated_conversation_is_a_specforge_row_per_turn_each_ending_with_its_reasoning() -> None:
    # so that `train_only_last_turn: true` trains every generated turn with its thinking, as SpecForge's
    # own expansion of reasoning conversations does: its template drops the thinking of earlier turns
    first, second = render(regenerated_conversation("c-3"), ExportFormat.SPECFORGE, source=SOURCE)
    assert (first["id"], second["id"]) == ("c-3/turn-1", "c-3/turn-2")
    assert [(turn["role"], turn["reasoning_content"]) for turn in first["conversations"]] == [
        ("system", None),
        ("user", None),
        ("assistant", "\nA greeting.\n"),
    ]
    assert [
        (turn["role"], turn["content"], turn["reasoning_content"]) for turn in second["conversations"]
    ] == [
        ("system", "You are terse.", None),
        ("user", "hi", None),
        ("assistant", "Hello.", ""),  # the answer the server was given back, without its thinking
        ("user", "what is 6*7?", None),
        ("assistant", "\n\nThe answer is 42.", "\nLet me think.\n"),
    ]


def test_messages_keep_a_regenerated_conversation_in_one_row_with_reasoning_on_every_turn() -> None:
    [row] = render(regenerated_conversation(), ExportFormat.MESSAGES, source=SOURCE)
    assert [turn.get("reasoning_content") for turn in row["messages"]] == [
        None,
        None,
        "\nA greeting.\n",
        None,
        "\nLet me think.\n",
    ]


def test_with_think_tags_every_regenerated_turn_inlines_its_own_reasoning() -> None:
    [row] = render(
        regenerated_conversation(), ExportFormat.MESSAGES, source=SOURCE, thinking=ThinkingStyle.TAGS
    )
    answers = [turn["content"] for turn in row["messages"] if turn["role"] == "assistant"]
    assert answers == [
        "<think>\nA greeting.\n</think>\n\nHello.",
        "<think>\nLet me think.\n</think>\n\nThe answer is 42.",
    ]


def test_speculators_gets_one_row_per_turn_each_with_its_own_requests_exact_ids() -> None:
    first, second = render(regenerated_conversation("c-9"), ExportFormat.SPECULATORS, source=SOURCE)
    assert (first["id"], second["id"]) == ("c-9/turn-1", "c-9/turn-2")
    assert first["input_ids"] == EARLIER_PROMPT_IDS + EARLIER_RESPONSE_IDS
    assert first["loss_mask"] == [0] * len(EARLIER_PROMPT_IDS) + [1] * len(EARLIER_RESPONSE_IDS)
    assert second["input_ids"] == PROMPT_IDS + RESPONSE_IDS
    assert (first["metadata"]["turn"], second["metadata"]["turn"]) == (1, 2)


def test_the_loss_check_counts_every_turn_of_a_regenerated_conversation() -> None:
    turns = turn_completions(regenerated_conversation())
    assert [loss_tokens(turn).count for turn in turns] == [len(EARLIER_RESPONSE_IDS), len(RESPONSE_IDS)]
    assert [len(turn.messages) for turn in turns] == [2, 4]  # each turn's own request


def test_a_think_marker_in_an_earlier_turn_marks_the_conversation() -> None:
    conversation = regenerated_conversation()
    marked = msgspec.structs.replace(
        conversation,
        earlier_turns=[msgspec.structs.replace(conversation.earlier_turns[0], content="</think> hi")],
    )
    assert raw_think_markers(marked) and not raw_think_markers(conversation)


def test_in_multi_turn_rows_only_the_generated_turn_carries_reasoning() -> None:
    [row] = render(completion(messages=MULTI_TURN), ExportFormat.SPECFORGE, source=SOURCE)
    turns = row["conversations"]
    assert [turn["role"] for turn in turns] == ["system", "user", "assistant", "user", "assistant"]
    assert [turn["reasoning_content"] for turn in turns] == [None, None, "", None, "\nLet me think.\n"]


def test_thinking_off_gives_an_empty_reasoning_string_not_null_on_the_reply() -> None:
    [row] = render(completion(reasoning=None), ExportFormat.SPECFORGE, source=SOURCE)
    assert row["conversations"][-1]["reasoning_content"] == ""


def test_tags_style_inlines_thinking_as_the_qwen3_template_renders_it() -> None:
    [row] = render(completion(), ExportFormat.MESSAGES, source=SOURCE, thinking=ThinkingStyle.TAGS)
    assert row["messages"][-1] == {
        "role": "assistant",
        "content": "<think>\nLet me think.\n</think>\n\nThe answer is 42.",
    }


def test_tags_style_keeps_the_empty_think_block_when_there_was_no_reasoning() -> None:
    [row] = render(
        completion(reasoning=None, content="OK."),
        ExportFormat.MESSAGES,
        source=SOURCE,
        thinking=ThinkingStyle.TAGS,
    )
    assert row["messages"][-1]["content"] == "<think>\n\n</think>\n\nOK."


def test_messages_rows_in_separate_style_carry_reasoning_content_on_every_turn() -> None:
    [row] = render(completion(messages=MULTI_TURN), ExportFormat.MESSAGES, source=SOURCE)
    assert set(row) == {"id", "messages", "run", "part"}
    assert all(set(turn) == {"role", "content", "reasoning_content"} for turn in row["messages"])
    assert row["messages"][-1]["reasoning_content"] == "\nLet me think.\n"


def test_sharegpt_rows_name_the_roles_system_human_gpt() -> None:
    [row] = render(completion(messages=MULTI_TURN), ExportFormat.SHAREGPT, source=SOURCE)
    assert [turn["from"] for turn in row["conversations"]] == ["system", "human", "gpt", "human", "gpt"]
    assert row["conversations"][-1]["value"] == "\n\nThe answer is 42."
    assert row["conversations"][-1]["reasoning_content"] == "\nLet me think.\n"


def test_sharegpt_rows_in_tags_style_hold_only_from_and_value() -> None:
    [row] = render(completion(), ExportFormat.SHAREGPT, source=SOURCE, thinking=ThinkingStyle.TAGS)
    assert all(set(turn) == {"from", "value"} for turn in row["conversations"])
    assert row["conversations"][-1]["value"].startswith("<think>\nLet me think.\n</think>\n\n")


def test_a_role_sharegpt_cannot_name_is_refused_naming_the_prompt() -> None:
    odd = [Message(role="tool", content="{}"), Message(role="user", content="go")]
    with pytest.raises(UnknownRole, match="p-tool"):
        render(completion("p-tool", messages=odd), ExportFormat.SHAREGPT, source=SOURCE)


def test_rows_with_raw_think_markers_are_flagged() -> None:
    assert raw_think_markers(completion(content="\n\n</think> oops"))
    assert raw_think_markers(completion(reasoning="I wrote <think> again"))
    assert not raw_think_markers(completion())
    assert not raw_think_markers(completion(reasoning=None))


def test_loss_tokens_are_exact_from_the_response_ids() -> None:
    assert loss_tokens(completion()) == loss_tokens(completion(), tokenizer=len)
    assert loss_tokens(completion()).count == len(RESPONSE_IDS)
    assert loss_tokens(completion()).source is LossSource.IDS


def test_without_ids_loss_tokens_count_the_generated_text_with_the_tokenizer() -> None:
    seen: list[str] = []

    def tokenizer(text: str) -> int:
        seen.append(text)
        return len(text.split())

    count = loss_tokens(completion(with_ids=False), tokenizer=tokenizer)
    assert seen == ["Let me think.\n</think>\n\nThe answer is 42.<|im_end|>"]
    assert (count.count, count.source) == (len(seen[0].split()), LossSource.TOKENIZER)


def noting(seen: list[str]) -> TokenCounter:
    """A tokenizer that notes each text it is given and counts it as no tokens."""

    def count(text: str) -> int:
        seen.append(text)
        return 0

    return count


def test_a_budget_hit_counts_no_closing_tokens_the_server_never_sampled() -> None:
    seen: list[str] = []
    cut = completion(
        with_ids=False, content="", finish_reason="length", quality=Quality.TRUNCATED_IN_THINKING
    )
    loss_tokens(cut, tokenizer=noting(seen))
    assert seen == ["Let me think."]


def test_with_thinking_off_the_loss_text_is_the_answer_and_its_end_of_turn() -> None:
    seen: list[str] = []
    off = completion(with_ids=False, reasoning=None, content="OK.", enable_thinking=False)
    loss_tokens(off, tokenizer=noting(seen))
    assert seen == ["OK.<|im_end|>"]


def test_without_ids_or_tokenizer_loss_tokens_are_estimated_from_usage() -> None:
    count = loss_tokens(completion(with_ids=False))
    assert (count.count, count.source) == (40, LossSource.USAGE)


def test_sequence_tokens_come_from_the_ids_and_else_from_usage() -> None:
    assert sequence_tokens(completion()) == len(PROMPT_IDS) + len(RESPONSE_IDS)
    assert sequence_tokens(completion(with_ids=False)) == len(PROMPT_IDS) + 40


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def _mixed_completions() -> list[Completion]:
    """Rows whose optional parts differ between the first and the later chunks of a file."""
    early = [
        completion(f"a{i}", reasoning=None, spec_accept_length=None, seed=None)
        for i in range(ROWS_PER_FILE // 2)
    ]
    late = [completion(f"b{i}", messages=MULTI_TURN) for i in range(ROWS_PER_FILE // 2)]
    regenerated = [regenerated_conversation(f"c{i}") for i in range(ROWS_PER_FILE // 2)]
    return early + late + regenerated


FORMAT_CASES = [
    (ExportFormat.SPECULATORS, ThinkingStyle.SEPARATE, "input_ids"),
    (ExportFormat.SPECFORGE, ThinkingStyle.SEPARATE, "conversations"),
    (ExportFormat.SHAREGPT, ThinkingStyle.SEPARATE, "conversations"),
    (ExportFormat.SHAREGPT, ThinkingStyle.TAGS, "conversations"),
    (ExportFormat.MESSAGES, ThinkingStyle.SEPARATE, "messages"),
    (ExportFormat.MESSAGES, ThinkingStyle.TAGS, "messages"),
]


@pytest.mark.parametrize(("fmt", "thinking", "column"), FORMAT_CASES)
def test_every_format_loads_with_datasets_json(
    tmp_path: Path, fmt: ExportFormat, thinking: ThinkingStyle, column: str
) -> None:
    rows = [row for c in _mixed_completions() for row in render(c, fmt, source=SOURCE, thinking=thinking)]
    path = tmp_path / "rows.jsonl"
    _write_jsonl(path, rows)
    hf_datasets.disable_progress_bars()
    dataset = hf_datasets.load_dataset(
        "json",
        data_files=str(path),
        split="train",
        cache_dir=str(tmp_path / "hf"),
        chunksize=SMALL_CHUNK_BYTES,
    )
    assert dataset.num_rows == len(rows)
    assert dataset["id"] == [row["id"] for row in rows]
    assert dataset[len(rows) - 1][column] == rows[-1][column]
    if fmt is ExportFormat.SPECULATORS:
        assert dataset[0]["loss_mask"] == rows[0]["loss_mask"]
        assert dataset[0]["metadata"]["part"] == SOURCE.part
    else:
        assert set(dataset.column_names) == {"id", column, "run", "part"}
        # A list of structs with one set of keys, not an opaque JSON blob per row.
        assert set(dataset.features[column].feature) == set(rows[-1][column][-1])
