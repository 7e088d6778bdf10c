"""Write the same prompts in each input format drafter training data comes in."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.producer.producer_test_data import write_arrow_stream


def questions(count: int, prefix: str) -> list[dict[str, object]]:
    return [
        {"id": f"{prefix}-{i}", "question": f"Question {prefix} {i}: what is {i} squared, and why?"}
        for i in range(count)
    ]


def as_messages(row: dict[str, object]) -> dict[str, object]:
    return {
        "id": row["id"],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": row["question"]},
        ],
    }


def as_prompt(row: dict[str, object]) -> dict[str, object]:
    return {"id": row["id"], "prompt": row["question"]}


def as_sharegpt(row: dict[str, object]) -> dict[str, object]:
    return {
        "id": row["id"],
        "conversations": [
            {"from": "human", "value": row["question"]},
            {"from": "gpt", "value": "old answer"},
        ],
    }


def write_jsonl(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict[str, object]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_hf_folder(folder: Path, rows: list[dict[str, object]]) -> Path:
    folder.mkdir(parents=True)
    write_arrow_stream(folder / "data-00000-of-00001.arrow", pa.Table.from_pylist(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "train"})
    )
    return folder
