"""Staging a model folder: complete or refused, never half there, and cheap to repeat."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest

from core.exit_codes import EXIT_FAILED, EXIT_OK
from node.cli import register
from node.errors import NotEnoughRoom, StagingError, VerificationFailed
from node.model_sources import LocalSource, SourceFile, open_source
from node.staging import INDEX_FILE, default_destination, stage_model

BUCKET = "models"
PLENTY_OF_ROOM_BYTES = 10**12


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def shards_of(root: Path) -> list[Path]:
    return sorted(root.glob("*.safetensors"))


@dataclass
class RecordingProgress:
    total_bytes: int = -1
    advanced_bytes: int = 0
    ended: bool = False
    files: list[int] = field(default_factory=list)

    def begin(self, total_bytes: int, file_count: int) -> None:
        self.total_bytes = total_bytes
        self.files.append(file_count)

    def advance(self, n_bytes: int) -> None:
        self.advanced_bytes += n_bytes

    def end(self) -> None:
        self.ended = True


def test_a_local_folder_is_copied_whole_and_verified(model_folder: Path, tmp_path: Path) -> None:
    destination = tmp_path / "shm" / "TinyModel"
    progress = RecordingProgress()

    report = stage_model(LocalSource(model_folder), destination, progress=progress)

    assert files_under(destination) == files_under(model_folder)
    assert sorted(report.copied) == sorted(files_under(model_folder))
    assert report.skipped == ()
    assert progress.ended and progress.advanced_bytes == progress.total_bytes
    assert progress.total_bytes == report.bytes_copied - (model_folder / INDEX_FILE).stat().st_size


def test_staging_again_skips_every_file_and_touches_nothing(model_folder: Path, tmp_path: Path) -> None:
    destination = tmp_path / "TinyModel"
    stage_model(LocalSource(model_folder), destination)
    before = {p: p.stat().st_mtime_ns for p in destination.rglob("*") if p.is_file()}

    report = stage_model(LocalSource(model_folder), destination, free_bytes=lambda _: 0)

    assert report.copied == ()
    assert sorted(report.skipped) == sorted(files_under(model_folder))
    assert {p: p.stat().st_mtime_ns for p in destination.rglob("*") if p.is_file()} == before


def test_a_file_left_with_the_wrong_size_is_copied_again(model_folder: Path, tmp_path: Path) -> None:
    destination = tmp_path / "TinyModel"
    stage_model(LocalSource(model_folder), destination)
    shard = shards_of(destination)[0]
    shard.write_bytes(shard.read_bytes()[:100])

    report = stage_model(LocalSource(model_folder), destination)

    assert report.copied == (shard.name,)
    assert files_under(destination) == files_under(model_folder)


def test_a_missing_shard_is_refused_before_any_shard_is_copied(model_folder: Path, tmp_path: Path) -> None:
    # Given a source whose index lists a shard that is not there
    missing = shards_of(model_folder)[1]
    missing.unlink()
    destination = tmp_path / "TinyModel"

    # When I stage it
    with pytest.raises(VerificationFailed) as caught:
        stage_model(LocalSource(model_folder), destination)

    # Then the message names the missing shard, and no shard was copied
    assert f"shard {missing.name} is listed in {INDEX_FILE} but missing" in str(caught.value)
    assert shards_of(destination) == []


def test_a_shard_the_index_does_not_list_is_refused(model_folder: Path, tmp_path: Path) -> None:
    (model_folder / "model-stray.safetensors").write_bytes(b"stray")

    with pytest.raises(
        VerificationFailed, match=f"shard model-stray.safetensors is present but not listed in {INDEX_FILE}"
    ):
        stage_model(LocalSource(model_folder), tmp_path / "TinyModel")


@dataclass(frozen=True)
class SourceThatMisreportsASize:
    """A source whose listing and bytes disagree, as when a file changes while it is being staged."""

    inner: LocalSource
    wrong_file: str

    @property
    def name(self) -> str:
        return self.inner.name

    def list_files(self) -> list[SourceFile]:
        return [
            SourceFile(f.relpath, f.size_bytes + 1) if f.relpath == self.wrong_file else f
            for f in self.inner.list_files()
        ]

    def fetch(self, file: SourceFile, target: Path, advance: Callable[[int], object]) -> None:
        self.inner.fetch(file, target, advance)


def test_a_size_mismatch_fails_and_leaves_no_file_that_looks_complete(
    model_folder: Path, tmp_path: Path
) -> None:
    shard = shards_of(model_folder)[0].name
    destination = tmp_path / "TinyModel"

    with pytest.raises(VerificationFailed) as caught:
        stage_model(SourceThatMisreportsASize(LocalSource(model_folder), shard), destination)

    assert f"{shard} arrived with {300_000} bytes, the source listed {300_001}" in str(caught.value)
    assert not (destination / shard).exists()
    assert not list(destination.glob("*.partial"))


def test_too_little_room_is_refused_before_copying_with_both_sizes(
    model_folder: Path, tmp_path: Path
) -> None:
    destination = tmp_path / "TinyModel"

    with pytest.raises(NotEnoughRoom) as caught:
        stage_model(LocalSource(model_folder), destination, free_bytes=lambda _: 1024)

    assert caught.value.available_bytes == 1024
    assert caught.value.needed_bytes == sum(len(data) for data in files_under(model_folder).values())
    assert re.search(r"the copy needs 58\d\.\d KiB but only 1\.0 KiB is free", str(caught.value))
    assert not destination.exists() or files_under(destination) == {}


def test_the_default_destination_is_dev_shm_with_the_folder_name(model_folder: Path) -> None:
    assert default_destination(LocalSource(model_folder)) == Path("/dev/shm/TinyModel")
    assert default_destination(open_source("s3://models/qwen/Qwen3.6-27B/")) == Path("/dev/shm/Qwen3.6-27B")


def test_a_missing_source_folder_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="does not exist"):
        stage_model(LocalSource(tmp_path / "nope"), tmp_path / "dest")


def upload(folder: Path, prefix: str) -> None:
    s3 = boto3.client("s3")
    for relpath, data in files_under(folder).items():
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{relpath}", Body=data)


@pytest.fixture
def bucket(s3_env: str) -> Iterator[str]:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    yield BUCKET
    for item in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        s3.delete_object(Bucket=BUCKET, Key=item["Key"])
    s3.delete_bucket(Bucket=BUCKET)


def test_an_s3_prefix_is_staged_over_http_and_a_second_run_skips_everything(
    bucket: str, model_folder: Path, tmp_path: Path
) -> None:
    # Given the model under s3://models/qwen/TinyModel and a look-alike prefix beside it
    upload(model_folder, "qwen/TinyModel")
    boto3.client("s3").put_object(Bucket=bucket, Key="qwen/TinyModel-base/config.json", Body=b"{}")
    destination = tmp_path / "TinyModel"

    # When I stage it twice
    first = stage_model(open_source("s3://models/qwen/TinyModel"), destination)
    second = stage_model(open_source("s3://models/qwen/TinyModel"), destination)

    # Then the copy is exact, the look-alike was not mixed in, and the second run copied nothing
    assert files_under(destination) == files_under(model_folder)
    assert len(first.copied) == len(files_under(model_folder))
    assert second.copied == ()


def test_an_s3_prefix_with_a_missing_shard_is_refused(
    bucket: str, model_folder: Path, tmp_path: Path
) -> None:
    shards_of(model_folder)[0].unlink()
    upload(model_folder, "qwen/TinyModel")

    with pytest.raises(VerificationFailed, match=r"model-00001-of-00002\.safetensors is listed"):
        stage_model(open_source("s3://models/qwen/TinyModel"), tmp_path / "TinyModel")


def test_an_empty_s3_prefix_says_so(bucket: str, tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="no objects under s3://models/nothing-here"):
        stage_model(open_source("s3://models/nothing-here"), tmp_path / "x")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_the_stage_command_reports_what_it_copied_and_fails_clearly(
    model_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    destination = tmp_path / "dest"
    args = parse(["stage", str(model_folder), str(destination)])
    assert args.handler(args) == EXIT_OK
    assert "6 files copied" in capsys.readouterr().out

    assert args.handler(args) == EXIT_OK
    assert "0 files copied (0 B), 6 already there, all verified" in capsys.readouterr().out

    index = json.loads((model_folder / INDEX_FILE).read_text())
    index["weight_map"]["extra.weight"] = "model-00003-of-00002.safetensors"
    (model_folder / INDEX_FILE).write_text(json.dumps(index))
    args = parse(["stage", str(model_folder), str(tmp_path / "other")])
    assert args.handler(args) == EXIT_FAILED
    assert "model-00003-of-00002.safetensors is listed" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["Qwen/../../escaped", "Qwen//config.json", "Qwen/./x", "Qwen/..\\x"])
def test_an_s3_key_that_would_land_outside_the_destination_is_refused_before_anything_is_copied(
    bucket: str, model_folder: Path, tmp_path: Path, key: str
) -> None:
    upload(model_folder, "qwen/TinyModel")
    boto3.client("s3").put_object(Bucket=bucket, Key=f"qwen/TinyModel/{key}", Body=b"x")
    destination = tmp_path / "stage" / "TinyModel"
    with pytest.raises(StagingError, match="would land outside"):
        stage_model(open_source("s3://models/qwen/TinyModel"), destination)
    assert not any(tmp_path.rglob("escaped")) and not destination.exists()
