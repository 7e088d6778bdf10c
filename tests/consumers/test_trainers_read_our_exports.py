"""The trainers' own code reads what `producer export --format speculators` writes.

Run by `scripts/test --consumers` only (a venv with torch, speculators 0.9.0 and specforge 0.2.0;
docs/export.md), never by the default suite (`norecursedirs` in pyproject.toml). No model is loaded:
speculators' pre-tokenized path needs a processor only to tell text from multimodal and to print a
sample, so a tokenizer built here over the ids the test rows use stands in for the target's.

- speculators: `load_raw_dataset` (every *.json and *.jsonl under a folder, `data_generation/
  preprocessing.py` 725-775) and `build_speculator_training_dataset`, which `speculators prepare-data`
  runs, and that command itself; rows carrying `input_ids` and `loss_mask` pass through (458-487,
  603), cut to `--seq-length` (379-400), other columns dropped (634).
- SpecForge: `prepare_prompt_tasks` on `data.prompts_path`, which reads a JSONL whose first record has
  `input_ids` and `loss_mask` as pre-tokenized (`data/prompt_builder.py` 62-83, 219-252), with the
  DFlash provider's minimum loss tokens and loss-mask filter, as `training/assembly.py` 387-413 passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from core.records import Completion
from producer.cli import main
from tests.support.run_output import (
    completion,
    write_run_output,
)

speculators_data = pytest.importorskip("speculators.data_generation.preprocessing")
prompt_builder = pytest.importorskip("specforge.data.prompt_builder")
dflash = pytest.importorskip("specforge.algorithms.dflash.providers")
datasets = pytest.importorskip("datasets")
torch = pytest.importorskip("torch")

RUN = "qwen-think-v1"
CLOSED_REDIS = "redis://127.0.0.1:1/0"  # export must not need Redis
SEQ_LENGTH = 64  # the trainers' window in these tests: every row fits in it but LONG
LONG = "long"
PROMPT_IDS = 11  # the prompt of `completion()`: with a window this short, no loss token is left
SHARD_ROWS = 4  # 11 rows in 3 shards: the trainers must read them all


@pytest.fixture(scope="module")
def source() -> dict[str, Completion]:
    """The completions by prompt id: 10 rows of 55-59 ids, and one of 125 that the window cuts."""
    rows = [completion(f"p{part}-{i}", thinking_words=30 + i) for part in range(2) for i in range(5)]
    rows.append(completion(LONG, thinking_words=100))
    return {row.prompt_id: row for row in rows}


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory, source: dict[str, Completion]) -> str:
    rows = list(source.values())
    return write_run_output(tmp_path_factory.mktemp("run"), RUN, [rows[:5], rows[5:]])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, run_output: str) -> Path:
    """`producer export --format speculators` of the run, uncompressed as the trainers need it."""
    dest = tmp_path_factory.mktemp("export") / "speculators"
    assert export(run_output, dest) == 0
    return dest


def export(output: str, dest: Path, *options: str) -> int:
    argv = ["--redis-url", CLOSED_REDIS, "export", "--run", RUN, "--format", "speculators"]
    argv += ["--to", str(dest), "--output", output, "--shard-rows", str(SHARD_ROWS), *options]
    return main(argv)


def expected(row: Completion, window: int) -> tuple[list[int], list[int]]:
    """The server's ids with loss on the response, as a trainer with `window` keeps them."""
    prompt, response = row.prompt_token_ids or [], row.response_token_ids or []
    return [*prompt, *response][:window], ([0] * len(prompt) + [1] * len(response))[:window]


def shard_ids(data: Path) -> list[str]:
    """Row ids in the order a reader of the sorted shards meets them."""
    return [
        json.loads(line)["id"]
        for shard in sorted(data.glob("train-*.jsonl"))
        for line in shard.read_text().splitlines()
    ]


def test_speculators_passes_our_rows_through_with_ids_and_masks_cut_to_seq_length(
    exported: Path, source: dict[str, Completion], target_tokenizer: Path
) -> None:
    raw, _ = speculators_data.load_raw_dataset(str(exported / "data"))
    assert raw["id"] == shard_ids(exported / "data")
    processor = speculators_data.load_processor(str(target_tokenizer))
    rows = speculators_data.build_speculator_training_dataset(
        raw, processor, max_length=SEQ_LENGTH, num_proc=1
    )
    assert rows.column_names == ["input_ids", "loss_mask", "seq_len"]  # id and metadata are dropped
    assert len(rows) == len(source)
    for prompt_id, row in zip(raw["id"], rows, strict=True):
        ids, mask = expected(source[prompt_id], SEQ_LENGTH)
        assert row["input_ids"].tolist() == ids, prompt_id
        assert row["loss_mask"].tolist() == mask, prompt_id
        assert int(row["seq_len"]) == len(ids)
    long, long_source = rows[raw["id"].index(LONG)], source[LONG]
    assert len(long_source.prompt_token_ids or []) + len(long_source.response_token_ids or []) > SEQ_LENGTH
    assert int(long["seq_len"]) == SEQ_LENGTH
    assert int(long["loss_mask"].sum()) == SEQ_LENGTH - PROMPT_IDS  # its start is still learnt from


def test_speculators_drops_a_row_whose_window_holds_no_response_token(
    exported: Path, source: dict[str, Completion], target_tokenizer: Path
) -> None:
    raw, _ = speculators_data.load_raw_dataset(str(exported / "data"))
    processor = speculators_data.load_processor(str(target_tokenizer))
    build = speculators_data.build_speculator_training_dataset
    assert len(build(raw, processor, max_length=PROMPT_IDS, num_proc=1)) == 0
    one_each = build(raw, processor, max_length=PROMPT_IDS + 1, num_proc=1)
    assert [int(row["loss_mask"].sum()) for row in one_each] == [1] * len(source)


def test_speculators_prepare_data_command_writes_our_rows_and_counts_our_loss_tokens(
    exported: Path, source: dict[str, Completion], target_tokenizer: Path, tmp_path: Path
) -> None:
    out = tmp_path / "prepared"
    command = Path(sys.executable).with_name("speculators")
    argv = [str(command), "prepare-data", "--model", str(target_tokenizer), "--data", str(exported / "data")]
    argv += ["--output", str(out), "--seq-length", str(SEQ_LENGTH), "--num-preprocessing-workers", "1"]
    argv += ["--no-skip-token-freq"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    prepared = datasets.load_from_disk(str(out))
    assert prepared.format["type"] == "torch"  # as its trainer loads it
    got = sorted((row["input_ids"], row["loss_mask"]) for row in prepared.with_format(None))
    assert got == sorted(expected(row, SEQ_LENGTH) for row in source.values())  # shuffled by its seed

    frequencies = torch.load(out / "token_freq.pt", weights_only=True)
    counted: Counter[int] = Counter()
    for row in source.values():
        ids, mask = expected(row, SEQ_LENGTH)
        counted.update(token for token, loss in zip(ids, mask, strict=True) if loss)
    assert frequencies == dict(counted)


def test_speculators_needs_the_data_folder_uncompressed(
    exported: Path, run_output: str, tmp_path: Path
) -> None:
    """`--data DEST` also finds export.json and .export/: point it at DEST/data. A compressed
    export's shards (.jsonl.gz, .jsonl.zst) are not .json/.jsonl files to its folder reader."""
    with pytest.raises(datasets.exceptions.DatasetGenerationError):
        speculators_data.load_raw_dataset(str(exported))
    assert export(run_output, tmp_path / "gz", "--compression", "gz") == 0
    with pytest.raises(ValueError, match=r"No \.json/\.jsonl files found"):
        speculators_data.load_raw_dataset(str(tmp_path / "gz" / "data"))


def specforge_prompts(path: Path, *, cache: Path) -> list[dict[str, list[int]]]:
    """SpecForge's online prompt preparation of `data.prompts_path` for DFlash (`_prepare_prompts`)."""
    provider = dflash.algorithm_providers().model
    min_loss_tokens = provider.minimum_loss_tokens(None, {"block_size": 16})
    assert min_loss_tokens == 2
    prompts = prompt_builder.prepare_prompt_tasks(
        path,
        None,  # the target's tokenizer: unused for pre-tokenized records
        chat_template="qwen3.5",
        max_length=SEQ_LENGTH,
        is_preformatted=False,
        train_only_last_turn=True,
        cache_dir=str(cache),
        cache_key="consumers",
        num_proc=1,
        min_loss_tokens=min_loss_tokens,
        loss_mask_filter=provider.loss_mask_filter,
    )
    return [prompt["payload"] for prompt in prompts]


def test_specforge_reads_our_speculators_rows_as_pretokenized_prompts(
    exported: Path, source: dict[str, Completion], tmp_path: Path
) -> None:
    """`data.prompts_path` is one file: the shards concatenated (`cat DEST/data/train-*.jsonl`)."""
    prompts_path = tmp_path / "prompts.jsonl"
    shards = sorted((exported / "data").glob("train-*.jsonl"))
    prompts_path.write_bytes(b"".join(shard.read_bytes() for shard in shards))
    payloads = specforge_prompts(prompts_path, cache=tmp_path / "cache")
    order = shard_ids(exported / "data")
    want = [expected(source[prompt_id], SEQ_LENGTH) for prompt_id in order]
    assert [(p["input_ids"], p["loss_mask"]) for p in payloads] == want
    assert len(payloads[order.index(LONG)]["input_ids"]) == SEQ_LENGTH
    # One shard alone is read the same way.
    first = specforge_prompts(shards[0], cache=tmp_path / "cache")
    assert [(p["input_ids"], p["loss_mask"]) for p in first] == want[:SHARD_ROWS]


def test_specforge_reads_one_uncompressed_file(exported: Path, run_output: str, tmp_path: Path) -> None:
    """`prepare_prompt_tasks` opens the path as one file before anything else, for `prompts_path` and
    `train_data_path` alike: neither the shards' folder nor a glob of them is read."""
    with pytest.raises(IsADirectoryError):
        specforge_prompts(exported / "data", cache=tmp_path / "cache")
    with pytest.raises(FileNotFoundError):
        specforge_prompts(exported / "data" / "train-*.jsonl", cache=tmp_path / "cache")
    assert export(run_output, tmp_path / "gz", "--compression", "gz") == 0
    shard = sorted((tmp_path / "gz" / "data").glob("train-*.jsonl.gz"))[0]
    with pytest.raises((UnicodeDecodeError, ValueError)):
        specforge_prompts(shard, cache=tmp_path / "cache")
