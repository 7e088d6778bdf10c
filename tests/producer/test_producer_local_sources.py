"""Local DATA: JSONL (plain, .gz, .zst), Parquet, folders, Hugging Face save_to_disk folders."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from producer_test_data import WriteHuggingFaceDataset, WriteJsonl, WriteParquet, jsonl_lines

from core.records import Message, Prompt
from intake.errors import SourceError
from intake.input_files import SourceRow, open_rows
from intake.limits import ReadLimits
from intake.reading import PROMPT_COLUMNS, iter_prompts
from intake.rejected import RejectedRow

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

ROWS = [
    {"id": "m", "messages": [{"role": "user", "content": "from messages"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "from conversations"}]},
    {"id": "p", "prompt": "from prompt", "system": "S"},
]
EXPECTED = [
    Prompt(id="m", messages=[Message(role="user", content="from messages")], row=1),
    Prompt(id="c", messages=[Message(role="user", content="from conversations")], row=2),
    Prompt(
        id="p",
        messages=[Message(role="system", content="S"), Message(role="user", content="from prompt")],
        row=3,
    ),
]


def read(path: Path | str) -> list[Prompt | RejectedRow]:
    return list(iter_prompts(str(path)))


# --- JSONL --------------------------------------------------------------------------------


def test_a_jsonl_file_yields_one_prompt_per_line_in_every_row_format(write_jsonl: WriteJsonl) -> None:
    assert read(write_jsonl(ROWS)) == EXPECTED


def test_blank_lines_are_skipped_but_row_numbers_stay_physical_line_numbers(write_jsonl: WriteJsonl) -> None:
    path = write_jsonl(["", ROWS[0], "   ", "", {"prompt": ""}, "\t"])
    assert read(path) == [
        Prompt(id="m", messages=[Message(role="user", content="from messages")], row=2),
        RejectedRow(row=5, reason="prompt: is empty"),
    ]


def test_a_broken_json_line_is_rejected_with_the_json_error_and_the_rest_is_read(
    write_jsonl: WriteJsonl,
) -> None:
    path = write_jsonl([ROWS[0], '{"prompt": "unfinished', ROWS[2]])
    first, broken, last = read(path)
    assert isinstance(first, Prompt) and isinstance(last, Prompt)
    assert broken == RejectedRow(row=2, reason="invalid JSON: Input data was truncated")


def test_a_line_of_invalid_utf8_is_a_rejected_row(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n{"prompt": "ok"}\n')
    rejected, accepted = read(path)
    assert rejected == RejectedRow(row=1, reason="invalid JSON: Invalid UTF-8 encoded string")
    assert isinstance(accepted, Prompt)


def test_a_utf8_byte_order_mark_and_crlf_line_endings_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + jsonl_lines(ROWS).replace("\n", "\r\n").encode())
    assert read(path) == EXPECTED


def test_a_gzipped_jsonl_file_is_read_as_a_stream(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_lines(ROWS).encode()))
    assert read(path) == EXPECTED


def test_a_zstd_jsonl_file_is_read_as_a_stream(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl.zst"
    path.write_bytes(zstd.compress(jsonl_lines(ROWS).encode()))
    assert read(path) == EXPECTED


def test_a_truncated_gzip_file_yields_its_good_rows_then_raises_a_source_error(tmp_path: Path) -> None:
    many = [{"prompt": f"question {index}"} for index in range(2000)]
    compressed = gzip.compress(jsonl_lines(many).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(compressed[: len(compressed) // 2])
    received: list[Prompt | RejectedRow] = []
    with pytest.raises(SourceError, match=r"cut\.jsonl\.gz: unreadable after row \d+"):
        received.extend(iter_prompts(str(path)))
    assert received and all(isinstance(item, Prompt) for item in received)


# --- Parquet ------------------------------------------------------------------------------


def test_a_parquet_file_yields_one_prompt_per_row_numbered_from_one(write_parquet: WriteParquet) -> None:
    rows = [{"id": f"r{index}", "prompt": f"question {index}"} for index in range(2500)]
    prompts = read(write_parquet(rows, row_group_size=1000))
    assert [(p.id, p.row) for p in prompts if isinstance(p, Prompt)] == [
        (f"r{i}", i + 1) for i in range(2500)
    ]


def test_a_parquet_row_over_the_row_limit_is_rejected_with_its_size_and_the_rows_around_it_are_read(
    tmp_path: Path,
) -> None:
    limits = ReadLimits(max_row_bytes=1000)
    rows = [{"id": f"r{i}", "prompt": "x" * (5000 if i == 3 else 10)} for i in range(2500)]
    path = tmp_path / "one-long.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    read = list(iter_prompts(str(path), limits=limits))
    assert [item.row for item in read] == list(range(1, 2501))
    (rejected,) = [item for item in read if isinstance(item, RejectedRow)]
    assert rejected.row == 4 and rejected.reason.startswith(
        "row is 5,002 bytes, over the limit of 1,000"
    )  # prompt and id


def test_a_parquet_row_group_holding_more_than_the_limit_a_row_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "big-cells.parquet"
    pq.write_table(pa.table({"prompt": ["x" * 5000] * 10}), path, row_group_size=5, compression="zstd")
    with pytest.raises(SourceError, match=r"big-cells\.parquet: row group 0 \(rows 1-5\) holds [\d,]+ bytes"):
        iter_prompts(str(path), limits=ReadLimits(max_row_bytes=1000))


def test_parquet_messages_with_content_parts_and_null_fields_are_read(write_parquet: WriteParquet) -> None:
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    rows = [
        {"messages": [{"role": "user", "content": parts}], "prompt": None},
        {"messages": None, "prompt": "plain"},
    ]
    first, second = read(write_parquet(rows))
    assert isinstance(first, Prompt) and first.messages == [Message(role="user", content="Hello there")]
    assert isinstance(second, Prompt) and second.messages == [Message(role="user", content="plain")]


def test_only_the_prompt_columns_of_a_parquet_file_are_read(write_parquet: WriteParquet) -> None:
    path = write_parquet([{"prompt": "q", "response": "a very long answer", "score": 0.5}])
    (source_row,) = open_rows(str(path), columns=PROMPT_COLUMNS)
    assert source_row == SourceRow(row=1, value={"prompt": "q"})


def test_a_parquet_file_with_none_of_the_prompt_columns_is_a_source_error(
    write_parquet: WriteParquet,
) -> None:
    path = write_parquet([{"question": "q", "answer": "a"}])
    with pytest.raises(SourceError, match="has none of the columns messages, conversations, prompt"):
        iter_prompts(str(path))


def test_a_file_named_parquet_that_is_not_parquet_is_a_source_error(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_text("this is not parquet")
    with pytest.raises(SourceError, match="not a readable Parquet file"):
        iter_prompts(str(path))


def test_a_bad_parquet_row_is_rejected_by_its_row_index(write_parquet: WriteParquet) -> None:
    rows = [{"prompt": "ok"}, {"prompt": ""}, {"prompt": "ok too"}]
    assert read(write_parquet(rows))[1] == RejectedRow(row=2, reason="prompt: is empty")


# --- folders ------------------------------------------------------------------------------


def test_a_folder_reads_every_jsonl_and_parquet_file_in_path_order_and_names_the_file(
    tmp_path: Path, write_jsonl: WriteJsonl, write_parquet: WriteParquet
) -> None:
    write_jsonl([{"prompt": "b1"}, {"prompt": ""}], name="folder/b.jsonl")
    write_parquet([{"prompt": "a1"}], name="folder/a.parquet")
    write_jsonl([{"prompt": "c1"}], name="folder/sub/c.jsonl")
    (tmp_path / "folder" / "README.md").write_text("side file")
    (tmp_path / "folder" / "dataset_info.json").write_text("{}")
    (tmp_path / "folder" / "_SUCCESS").write_text("")
    (tmp_path / "folder" / ".hidden.jsonl").write_text("not data")
    items = read(tmp_path / "folder")
    assert [(i.row, i.messages[0].content) for i in items if isinstance(i, Prompt)] == [
        (1, "a1"),
        (1, "b1"),
        (1, "c1"),
    ]
    assert RejectedRow(row=2, reason="prompt: is empty", file="b.jsonl") in items


def test_a_folder_with_an_unknown_file_type_is_a_source_error_not_a_silent_skip(
    tmp_path: Path, write_jsonl: WriteJsonl
) -> None:
    write_jsonl(ROWS, name="folder/a.jsonl")
    (tmp_path / "folder" / "b.csv").write_text("prompt\nhi\n")
    with pytest.raises(SourceError, match=r"b\.csv: unknown file type"):
        iter_prompts(str(tmp_path / "folder"))


def test_a_json_data_file_in_a_folder_is_a_source_error_with_a_hint_to_rename_it(
    tmp_path: Path, write_jsonl: WriteJsonl
) -> None:
    write_jsonl(ROWS, name="folder/train.json")
    with pytest.raises(SourceError, match=r"rename it \.jsonl"):
        iter_prompts(str(tmp_path / "folder"))


def test_a_folder_without_data_files_is_a_source_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match=r"no \.jsonl, \.jsonl\.gz, \.jsonl\.zst, \.parquet files in it"):
        iter_prompts(str(tmp_path / "empty"))


# --- Hugging Face save_to_disk ------------------------------------------------------------


def test_a_hugging_face_dataset_folder_is_read_from_its_arrow_shards(
    write_hf_dataset: WriteHuggingFaceDataset,
) -> None:
    rows = [
        {"id": f"r{index}", "messages": [{"role": "user", "content": f"q{index}"}]} for index in range(10)
    ]
    items = read(write_hf_dataset(rows, shards=3))
    assert [i.id for i in items if isinstance(i, Prompt)] == [f"r{index}" for index in range(10)]
    assert [i.row for i in items if isinstance(i, Prompt)] == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]


def test_a_bad_row_in_a_hugging_face_shard_names_the_shard(write_hf_dataset: WriteHuggingFaceDataset) -> None:
    items = read(write_hf_dataset([{"prompt": "ok"}, {"prompt": " "}], shards=2))
    assert items[1] == RejectedRow(row=1, reason="prompt: is empty", file="data-00001-of-00002.arrow")


def test_a_hugging_face_dataset_dict_folder_asks_for_one_split(
    tmp_path: Path, write_hf_dataset: WriteHuggingFaceDataset
) -> None:
    write_hf_dataset([{"prompt": "q"}], name="dict/train")
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with pytest.raises(SourceError, match="DatasetDict folder: pass one split's folder"):
        iter_prompts(str(tmp_path / "dict"))


def test_a_hugging_face_shard_listed_in_state_json_but_missing_is_a_source_error(
    write_hf_dataset: WriteHuggingFaceDataset,
) -> None:
    folder = write_hf_dataset([{"prompt": "q"}])
    (folder / "data-00000-of-00001.arrow").unlink()
    with pytest.raises(SourceError, match=r"listed in state\.json but missing"):
        iter_prompts(str(folder))


@pytest.mark.parametrize("shard", ["../outside.arrow", "/etc/passwd", "sub//x.arrow"])
def test_a_hugging_face_shard_name_reaching_outside_its_folder_is_refused(
    write_hf_dataset: WriteHuggingFaceDataset, shard: str
) -> None:
    folder = write_hf_dataset([{"prompt": "q"}])
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": shard}], "_split": "train"}))
    with pytest.raises(SourceError, match="is not a plain name inside"):
        iter_prompts(str(folder))


def test_a_hugging_face_shard_without_prompt_columns_is_a_source_error(
    write_hf_dataset: WriteHuggingFaceDataset,
) -> None:
    with pytest.raises(SourceError, match="has none of the columns"):
        iter_prompts(str(write_hf_dataset([{"text": "q"}])))


# --- whole-source errors ------------------------------------------------------------------


def test_a_missing_path_is_a_source_error_raised_at_the_call(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file or folder"):
        iter_prompts(str(tmp_path / "nope.jsonl"))


def test_an_empty_data_argument_is_a_source_error_not_the_current_folder() -> None:
    with pytest.raises(SourceError, match="DATA is empty"):
        iter_prompts("")


@pytest.mark.parametrize("name", ["data.json", "data.csv", "data.jsonl.bz2", "data.arrow"])
def test_an_unknown_file_type_is_a_source_error(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("{}")
    with pytest.raises(SourceError, match="unknown file type"):
        iter_prompts(str(tmp_path / name))


def test_a_parquet_table_written_by_pandas_with_an_index_column_is_read(tmp_path: Path) -> None:
    path = tmp_path / "pandas.parquet"
    table = pa.table({"prompt": ["a", "b"], "__index_level_0__": [10, 11]})
    pq.write_table(table, path)
    assert [p.messages[0].content for p in read(path) if isinstance(p, Prompt)] == ["a", "b"]
