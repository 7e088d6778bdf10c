"""Fixtures of the producer's input tests: dataset files in every format, and a real S3 endpoint."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from producer_test_data import (
    WriteHuggingFaceDataset,
    WriteJsonl,
    WriteParquet,
    jsonl_lines,
    write_arrow_stream,
)

from tests.support.aws import FAKE_REGION, use_fake_aws

REGION = FAKE_REGION


@pytest.fixture
def write_jsonl(tmp_path: Path) -> WriteJsonl:
    def write(rows: Sequence[object], name: str = "data.jsonl") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(jsonl_lines(rows), encoding="utf-8")
        return path

    return write


@pytest.fixture
def write_parquet(tmp_path: Path) -> WriteParquet:
    def write(rows: Sequence[dict[str, object]], name: str = "data.parquet", **options: Any) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(list(rows)), path, **options)
        return path

    return write


@pytest.fixture
def write_hf_dataset(tmp_path: Path) -> WriteHuggingFaceDataset:
    """The layout `datasets.Dataset.save_to_disk` writes, made with pyarrow alone."""

    def write(rows: Sequence[dict[str, object]], name: str = "hf_dataset", shards: int = 1) -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True)
        table = pa.Table.from_pylist(list(rows))
        rows_per_shard = -(-len(rows) // shards)
        data_files = []
        for shard in range(shards):
            filename = f"data-{shard:05d}-of-{shards:05d}.arrow"
            write_arrow_stream(folder / filename, table.slice(shard * rows_per_shard, rows_per_shard))
            data_files.append({"filename": filename})
        (folder / "dataset_info.json").write_text(json.dumps({"citation": "", "features": {}}))
        state: dict[str, object] = {
            "_data_files": data_files,
            "_fingerprint": "0123456789abcdef",
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": "train",
        }
        (folder / "state.json").write_text(json.dumps(state))
        return folder

    return write


@pytest.fixture
def aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials, and no chance of reading a real AWS config from this machine."""
    use_fake_aws(monkeypatch, tmp_path)


@pytest.fixture
def s3_client(s3_endpoint: str, aws_environment: None) -> Any:
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name=REGION)


@pytest.fixture
def bucket(s3_client: Any) -> str:
    name = f"draftgen-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def put_jsonl(s3_client: Any, bucket: str) -> Callable[..., str]:
    """Uploads rows as a JSONL object (optionally compressed) and returns its s3:// URL."""

    def put(
        rows: Sequence[object], key: str = "data.jsonl", compress: Callable[[bytes], bytes] | None = None
    ) -> str:
        body = jsonl_lines(rows).encode()
        s3_client.put_object(Bucket=bucket, Key=key, Body=compress(body) if compress else body)
        return f"s3://{bucket}/{key}"

    return put
