"""`python -m producer export` on a run's committed output, as a user runs it after the fleet is gone."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import datasets as hf_datasets
import msgspec
import pytest

from core.records import Completion, Message, Quality
from producer.cli import main
from producer.export.exporter import ExportSettings, run_export, scan_output
from producer.export.formats import ExportFormat
from producer.export.selection import Selection
from producer.export.shards import Compression
from producer.export.source import RunOutput
from tests.support.run_output import SERVER_ID, completion, files_under, write_run_output
from workers.record.storage import FolderStore

RUN = "qwen-think-v1"
CLOSED_REDIS = "redis://127.0.0.1:1/0"  # nothing listens there: export must not need Redis
SHARD_ROWS = 7
GZIP_SHARDS = ("--shard-rows", str(SHARD_ROWS), "--compression", "gz")


@pytest.fixture
def healthy_output(tmp_path: Path) -> str:
    parts = [[completion(f"p{part}-{i}", thinking_words=40 + i) for i in range(10)] for part in range(3)]
    return write_run_output(tmp_path / "run", RUN, parts)


def export(output: str, dest: Path | str, fmt: str, *options: str) -> int:
    return main(
        [
            "--redis-url",
            CLOSED_REDIS,
            "export",
            "--run",
            RUN,
            "--format",
            fmt,
            "--to",
            str(dest),
            "--output",
            output,
            *options,
        ]
    )


def rows_in(dest: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((dest / "data").glob("train-*"))
        for line in path.read_text().splitlines()
    ]


@pytest.mark.parametrize("fmt", [f.value for f in ExportFormat])
def test_every_format_exports_every_ok_row_once_with_redis_gone(
    healthy_output: str, tmp_path: Path, fmt: str
) -> None:
    dest = tmp_path / fmt
    assert export(healthy_output, dest, fmt, "--shard-rows", str(SHARD_ROWS)) == 0
    rows = rows_in(dest)
    assert sorted(row["id"] for row in rows) == sorted(f"p{part}-{i}" for part in range(3) for i in range(10))
    assert len(list((dest / "data").glob("train-*-of-00005.jsonl"))) == 5  # 30 rows, 7 a shard
    loaded = hf_datasets.load_dataset("json", data_files=str(dest / "data" / "train-*.jsonl"), split="train")
    assert loaded.num_rows == 30


KEPT_TYPES = {"lang": "string", "score": "float", "tags": "json"}


@pytest.mark.parametrize("fmt", [f.value for f in ExportFormat])
def test_every_format_carries_the_runs_kept_columns_in_every_row_as_the_input_typed_them(
    tmp_path: Path, fmt: str
) -> None:
    kept = [
        {"lang": "en", "score": 0.5, "tags": '["a", "b"]'},  # a JSON column holds the value's JSON text
        {"lang": None, "score": 2.0, "tags": None},
    ]
    rows = [msgspec.structs.replace(completion(f"p{i}"), columns=columns) for i, columns in enumerate(kept)]
    output = write_run_output(tmp_path / "run", RUN, [rows], column_types=KEPT_TYPES)
    dest = tmp_path / fmt
    assert export(output, dest, fmt) == 0
    exported = {(row["lang"], row["score"], json.dumps(row["tags"])) for row in rows_in(dest)}
    assert exported == {("en", 0.5, '["a", "b"]'), (None, 2.0, "null")}
    loaded = hf_datasets.load_dataset("json", data_files=str(dest / "data" / "train-*.jsonl"), split="train")
    assert set(loaded["lang"]) == {"en", None} and set(loaded["score"]) == {0.5, 2.0}


def test_speculators_rows_carry_the_servers_ids_with_the_response_as_loss(
    healthy_output: str, tmp_path: Path
) -> None:
    assert export(healthy_output, tmp_path / "out", "speculators") == 0
    row = rows_in(tmp_path / "out")[0]
    source = completion(str(row["id"]), thinking_words=40)
    prompt_ids, response_ids = source.prompt_token_ids or [], source.response_token_ids or []
    assert row["input_ids"] == prompt_ids + response_ids
    assert row["loss_mask"] == [0] * len(prompt_ids) + [1] * len(response_ids)
    assert row["metadata"]["run"] == RUN
    assert str(row["metadata"]["part"]).startswith("data/part-000000-")


def test_a_thinking_off_run_is_refused_with_advice_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 914K-row disaster: thinking off, every answer "OK." in six tokens, every row labelled ok."""
    rows = [completion(f"p{i}", thinking=False, content="OK.") for i in range(40)]
    output = write_run_output(tmp_path / "run", RUN, [rows], thinking=False)
    dest = tmp_path / "out"
    assert export(output, dest, "specforge") == 1
    err = capsys.readouterr().err
    assert "refused" in err and "thinking" in err.lower()
    assert not dest.exists() or not any(dest.rglob("*"))


def test_force_exports_a_refused_run_and_its_card_says_so(tmp_path: Path) -> None:
    rows = [completion(f"p{i}", thinking=False, content="OK.") for i in range(40)]
    output = write_run_output(tmp_path / "run", RUN, [rows], thinking=False)
    assert export(output, tmp_path / "out", "specforge", "--force") == 0
    assert len(rows_in(tmp_path / "out")) == 40
    assert "overridden with --force" in (tmp_path / "out" / "README.md").read_text()


def test_only_ok_rows_go_out_unless_included_and_raw_think_markers_always_stay_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [completion(f"ok{i}") for i in range(40)]
    rows += [completion("cut", quality=Quality.TRUNCATED_IN_ANSWER)]
    rows += [completion("marker", content="\n\nthe answer is <think>")]
    output = write_run_output(tmp_path / "run", RUN, [rows])
    assert export(output, tmp_path / "default", "messages") == 0
    printed = capsys.readouterr().out
    assert "dropped: quality    1 (truncated_in_answer 1)" in printed
    assert "dropped: think_markers 1" in printed
    assert {row["id"] for row in rows_in(tmp_path / "default")} == {f"ok{i}" for i in range(40)}
    assert export(output, tmp_path / "wider", "messages", "--include", "truncated_in_answer") == 0
    assert "cut" in {row["id"] for row in rows_in(tmp_path / "wider")}


def test_rows_over_the_trainers_length_are_counted_and_kept_unless_asked_to_drop(
    healthy_output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export(healthy_output, tmp_path / "kept", "specforge", "--max-length", "70") == 0
    assert "longer than 70" in capsys.readouterr().out
    kept = len(rows_in(tmp_path / "kept"))
    assert (
        export(
            healthy_output, tmp_path / "dropped", "specforge", "--max-length", "70", "--over-length", "drop"
        )
        == 0
    )
    assert 0 < len(rows_in(tmp_path / "dropped")) < kept == 30


def test_an_export_killed_half_way_and_run_again_writes_byte_identical_files(
    healthy_output: str, tmp_path: Path
) -> None:
    assert export(healthy_output, tmp_path / "whole", "speculators", *GZIP_SHARDS) == 0

    class DiesAfterTwoShards(FolderStore):
        shards_put = 0

        def put_file(self, key: str, path: Path) -> None:
            if self.shards_put == 2:
                raise KeyboardInterrupt  # the export is killed here
            self.shards_put += 1
            super().put_file(key, path)

    output = RunOutput(FolderStore(Path(healthy_output.removeprefix("file://"))), RUN)
    settings = ExportSettings(
        run=RUN,
        format=ExportFormat.SPECULATORS,
        selection=Selection(format=ExportFormat.SPECULATORS, max_length=8192),
        shard_rows=SHARD_ROWS,
        compression=Compression.GZIP,
    )
    with pytest.raises(KeyboardInterrupt):
        run_export(output, DiesAfterTwoShards(tmp_path / "resumed"), settings, scan_output(output, settings))
    assert len(list((tmp_path / "resumed" / "data").glob("train-*"))) == 2
    assert export(healthy_output, tmp_path / "resumed", "speculators", *GZIP_SHARDS) == 0
    assert files_under(tmp_path / "resumed") == files_under(tmp_path / "whole")


def test_a_destination_holding_another_export_is_refused(
    healthy_output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export(healthy_output, tmp_path / "out", "specforge") == 0
    assert export(healthy_output, tmp_path / "out", "specforge") == 0  # the same export: nothing to do
    assert "already holds this export" in capsys.readouterr().out
    assert export(healthy_output, tmp_path / "out", "messages") == 2
    assert "holds another export" in capsys.readouterr().err


def test_the_dataset_card_names_the_server_the_sampling_and_the_loss_histogram(
    healthy_output: str, tmp_path: Path
) -> None:
    assert export(healthy_output, tmp_path / "out", "specforge", "--compression", "zst") == 0
    card = (tmp_path / "out" / "README.md").read_text()
    header = card.split("---")[1]
    assert 'path: "data/train-*.jsonl.zst"' in header and "base_model" in header
    assert SERVER_ID in card and "0.5.23" in card and "EAGLE" in card
    assert '"enable_thinking": true' in card
    assert "p50" in card
    record = json.loads((tmp_path / "out" / "export.json").read_text())
    assert record["plan"]["rows"] == 30 and record["loss_tokens"]["sources"]["ids"] == 30


def word_level_tokenizer(path: Path) -> Path:
    """A tokenizer.json of whole words and Qwen's end of turn, as `export --tokenizer` reads one."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "step": 1, "word": 2, "<|im_end|>": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    tokenizer.save(str(path))
    return path


def test_rows_without_token_ids_have_their_loss_tokens_counted_by_the_given_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [completion(f"p{i}", thinking_words=50, answer_words=10, with_ids=False) for i in range(20)]
    output = write_run_output(tmp_path / "run", RUN, [rows])
    tokenizer = word_level_tokenizer(tmp_path / "tokenizer.json")
    assert export(output, tmp_path / "out", "specforge", "--tokenizer", str(tokenizer)) == 0
    assert "without token ids   20" in capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "export.json").read_text())
    assert record["loss_tokens"]["sources"] == {"ids": 0, "tokenizer": 20, "usage": 0}
    assert export(output, tmp_path / "speculators", "speculators") == 1  # no ids: nothing to export


def test_a_missing_tokenizer_file_or_an_unknown_quality_is_a_clear_error(
    healthy_output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        export(healthy_output, tmp_path / "a", "specforge", "--tokenizer", str(tmp_path / "nope.json")) == 2
    )
    assert "No such file" in capsys.readouterr().err
    assert export(healthy_output, tmp_path / "b", "specforge", "--include", "truncated") == 2
    assert "unknown quality 'truncated'" in capsys.readouterr().err


def test_an_export_to_s3_lands_whole_with_its_card_and_record(
    healthy_output: str, s3_endpoint: str, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # as the uploader and the producer find S3
    assert export(healthy_output, f"s3://{bucket}/datasets/{RUN}", "speculators", *GZIP_SHARDS) == 0
    keys = {item["Key"] for item in s3_client.list_objects_v2(Bucket=bucket)["Contents"]}
    prefix = f"datasets/{RUN}/"
    assert {f"{prefix}README.md", f"{prefix}export.json"} <= keys
    shards = sorted(key for key in keys if key.startswith(f"{prefix}data/train-"))
    assert len(shards) == 5
    body = s3_client.get_object(Bucket=bucket, Key=shards[0])["Body"].read()
    assert len(gzip.decompress(body).splitlines()) == SHARD_ROWS


def conversation(prompt_id: str) -> Completion:
    """A conversation of two turns regenerated turn by turn."""
    last = completion(prompt_id)
    history = [*last.messages, Message(role="assistant", content="an earlier answer"), last.messages[-1]]
    earlier = completion(f"{prompt_id}-t1").as_turn()
    return msgspec.structs.replace(last, messages=history, earlier_turns=[earlier], conversation_turns=2)


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_a_row_per_turn_export_counts_its_rows_where_it_prints_and_titles_them(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    output = write_run_output(
        tmp_path / "run", RUN, [[conversation(f"c{i}") for i in range(3)], [completion("one")]]
    )
    dest = tmp_path / fmt
    assert export(output, dest, fmt) == 0
    assert len(rows_in(dest)) == 7
    assert "\n7 rows (from 4 completions, a row per turn) in 1 shards" in capsys.readouterr().out
    card = (dest / "README.md").read_text()
    assert f"# {RUN}: 7 rows for drafter training ({fmt})" in card
    assert "exported here as 7 rows (from 4 completions, a row per turn)" in card
