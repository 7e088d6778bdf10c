"""The trainers' own loaders read conversations regenerated turn by turn, as `producer export` writes them.

`--format speculators` writes one row per generated turn (`<id>/turn-<j>`) with that turn's request's
exact ids; speculators' `build_speculator_training_dataset` and SpecForge's pre-tokenized prompt
reader must keep every turn's ids and loss mask. `--format specforge` writes the whole conversation
with `reasoning_content` on every assistant turn; SpecForge's loader (`load_dataset("json")`, then its
thinking parser's turn keys) must see every turn with its reasoning. Run by `scripts/test --consumers`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.records import Completion
from producer.cli import main
from producer.export.formats import turn_completions
from tests.support.run_output import conversation, write_run_output

speculators_data = pytest.importorskip("speculators.data_generation.preprocessing")
prompt_builder = pytest.importorskip("specforge.data.prompt_builder")
dflash = pytest.importorskip("specforge.algorithms.dflash.providers")
datasets = pytest.importorskip("datasets")

RUN = "qwen-chat-v1"
CLOSED_REDIS = "redis://127.0.0.1:1/0"  # export must not need Redis
SEQ_LENGTH = 512  # every turn fits: what is checked is that each is read whole
CONVERSATIONS = 4
TURNS = 3


@pytest.fixture(scope="module")
def source() -> dict[str, Completion]:
    rows = [conversation(f"c{i}", turns=TURNS, thinking_words=40 + i) for i in range(CONVERSATIONS)]
    return {row.prompt_id: row for row in rows}


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory, source: dict[str, Completion]) -> str:
    return write_run_output(tmp_path_factory.mktemp("run"), RUN, [list(source.values())])


def export(output: str, dest: Path, fmt: str) -> Path:
    argv = ["--redis-url", CLOSED_REDIS, "export", "--run", RUN, "--format", fmt]
    assert main([*argv, "--to", str(dest), "--output", output]) == 0
    return dest / "data"


def turn_rows(source: dict[str, Completion]) -> dict[str, tuple[list[int], list[int]]]:
    """Every generated turn's ids and loss mask, by the row id speculators' export gives it."""
    expected = {}
    for prompt_id, row in source.items():
        for number, turn in enumerate(turn_completions(row), start=1):
            prompt, response = turn.prompt_token_ids or [], turn.response_token_ids or []
            expected[f"{prompt_id}/turn-{number}"] = (
                [*prompt, *response],
                [0] * len(prompt) + [1] * len(response),
            )
    return expected


def test_speculators_reads_one_row_per_turn_with_that_turns_exact_ids(
    run_output: str, source: dict[str, Completion], target_tokenizer: Path, tmp_path: Path
) -> None:
    data = export(run_output, tmp_path / "speculators", "speculators")
    raw, _ = speculators_data.load_raw_dataset(str(data))
    expected = turn_rows(source)
    assert sorted(raw["id"]) == sorted(expected)
    assert len(expected) == CONVERSATIONS * TURNS
    processor = speculators_data.load_processor(str(target_tokenizer))
    rows = speculators_data.build_speculator_training_dataset(
        raw, processor, max_length=SEQ_LENGTH, num_proc=1
    )
    for row_id, row in zip(raw["id"], rows, strict=True):
        ids, mask = expected[row_id]
        assert (row["input_ids"].tolist(), row["loss_mask"].tolist()) == (ids, mask), row_id


def test_specforge_reads_every_turn_as_a_pretokenized_prompt(
    run_output: str, source: dict[str, Completion], tmp_path: Path
) -> None:
    data = export(run_output, tmp_path / "speculators", "speculators")
    prompts_path = tmp_path / "prompts.jsonl"
    prompts_path.write_bytes(b"".join(shard.read_bytes() for shard in sorted(data.glob("train-*.jsonl"))))
    provider = dflash.algorithm_providers().model
    prompts = prompt_builder.prepare_prompt_tasks(
        prompts_path,
        None,
        chat_template="qwen3.5",
        max_length=SEQ_LENGTH,
        is_preformatted=False,
        train_only_last_turn=True,
        cache_dir=str(tmp_path / "cache"),
        cache_key="conversations",
        num_proc=1,
        min_loss_tokens=provider.minimum_loss_tokens(None, {"block_size": 16}),
        loss_mask_filter=provider.loss_mask_filter,
    )
    expected = turn_rows(source)
    order = [json.loads(line)["id"] for line in prompts_path.read_text().splitlines()]
    got = [(p["payload"]["input_ids"], p["payload"]["loss_mask"]) for p in prompts]
    assert got == [expected[row_id] for row_id in order]


def test_specforge_format_holds_the_whole_conversation_with_reasoning_on_every_turn(
    run_output: str, source: dict[str, Completion], tmp_path: Path
) -> None:
    data = export(run_output, tmp_path / "specforge", "specforge")
    loaded = datasets.load_dataset(
        "json", data_files=sorted(map(str, data.glob("train-*.jsonl"))), split="train"
    )
    assert sorted(loaded["id"]) == sorted(source)
    for row in loaded:
        generated = [turn for turn in row["conversations"] if turn["role"] == "assistant"]
        want = turn_completions(source[row["id"]])
        assert [turn["content"] for turn in generated] == [turn.content for turn in want]
        assert [turn["reasoning_content"] for turn in generated] == [turn.reasoning_content for turn in want]
