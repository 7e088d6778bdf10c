"""DATA on S3, read over real HTTP from moto's server through boto3."""

from __future__ import annotations

import gzip
import io
import sys
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ResponseStreamingError
from producer_test_data import WriteHuggingFaceDataset

from core.records import Message, Prompt
from intake.errors import SourceError
from intake.reading import iter_prompts
from intake.rejected import RejectedRow

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

PutJsonl = Callable[..., str]
ROWS = [{"id": f"q{index}", "prompt": f"question {index}"} for index in range(50)]
EXPECTED_IDS = [f"q{index}" for index in range(50)]


def ids_of(items: list[Prompt | RejectedRow]) -> list[str]:
    return [item.id for item in items if isinstance(item, Prompt)]


def read(url: str, client: Any) -> list[Prompt | RejectedRow]:
    return list(iter_prompts(url, s3_client_factory=lambda: client))


def test_a_jsonl_object_on_s3_is_streamed_into_prompts(put_jsonl: PutJsonl, s3_client: Any) -> None:
    url = put_jsonl([*ROWS, "{broken"])
    items = read(url, s3_client)
    assert ids_of(items) == EXPECTED_IDS
    assert isinstance(items[-1], RejectedRow) and items[-1].row == len(ROWS) + 1
    assert items[-1].reason.startswith("invalid JSON: ")


def test_the_default_client_finds_the_endpoint_through_aws_endpoint_url(
    put_jsonl: PutJsonl, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = put_jsonl(ROWS)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    assert ids_of(list(iter_prompts(url))) == EXPECTED_IDS


@pytest.mark.parametrize(
    ("key", "compress"), [("data.jsonl.gz", gzip.compress), ("data.jsonl.zst", zstd.compress)]
)
def test_a_compressed_jsonl_object_on_s3_is_decompressed_while_streaming(
    put_jsonl: PutJsonl, s3_client: Any, key: str, compress: Callable[[bytes], bytes]
) -> None:
    assert ids_of(read(put_jsonl(ROWS, key=key, compress=compress), s3_client)) == EXPECTED_IDS


def test_a_parquet_object_on_s3_is_read_with_ranged_requests(s3_client: Any, bucket: str) -> None:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(ROWS), buffer, row_group_size=10)
    s3_client.put_object(Bucket=bucket, Key="data.parquet", Body=buffer.getvalue())
    assert ids_of(read(f"s3://{bucket}/data.parquet", s3_client)) == EXPECTED_IDS


def test_a_prefix_with_a_trailing_slash_reads_every_file_under_it(
    put_jsonl: PutJsonl, s3_client: Any
) -> None:
    put_jsonl(ROWS[25:], key="shards/part-2.jsonl")
    url = put_jsonl([*ROWS[:25], {"prompt": ""}], key="shards/part-1.jsonl")
    items = read(url.rsplit("/", 1)[0] + "/", s3_client)
    assert ids_of(items) == EXPECTED_IDS
    assert RejectedRow(row=26, reason="prompt: is empty", file="part-1.jsonl") in items


def test_a_hugging_face_dataset_under_an_s3_prefix_is_read(
    s3_client: Any, bucket: str, write_hf_dataset: WriteHuggingFaceDataset
) -> None:
    folder = write_hf_dataset(ROWS, shards=2)
    for path in folder.iterdir():
        s3_client.put_object(Bucket=bucket, Key=f"hf/{path.name}", Body=path.read_bytes())
    assert ids_of(read(f"s3://{bucket}/hf/", s3_client)) == EXPECTED_IDS


def test_a_missing_object_is_a_source_error_raised_at_the_call(s3_client: Any, bucket: str) -> None:
    with pytest.raises(SourceError, match="no such S3 object"):
        iter_prompts(f"s3://{bucket}/missing.jsonl", s3_client_factory=lambda: s3_client)


def test_a_missing_bucket_is_a_source_error(s3_client: Any) -> None:
    with pytest.raises(SourceError, match="no-such-bucket-draftgen"):
        iter_prompts("s3://no-such-bucket-draftgen/data.jsonl", s3_client_factory=lambda: s3_client)


def test_an_empty_prefix_is_a_source_error(s3_client: Any, bucket: str) -> None:
    with pytest.raises(SourceError, match="no such S3 object or prefix"):
        iter_prompts(f"s3://{bucket}/nothing/", s3_client_factory=lambda: s3_client)


# --- a connection dropped mid-stream ------------------------------------------------------


class BodyThatBreaks:
    """A response body that fails like a dropped connection after `limit` bytes."""

    def __init__(self, body: Any, limit: int) -> None:
        self._body = body
        self._left = limit

    def read(self, amount: int) -> bytes:
        if self._left <= 0:
            raise ResponseStreamingError(error="connection reset by peer")
        chunk: bytes = self._body.read(min(amount, self._left))
        self._left -= len(chunk)
        return chunk

    def close(self) -> None:
        self._body.close()


class ClientWithFlakyStreams:
    """The real boto3 client; its first `breaks` responses drop after `limit` bytes."""

    def __init__(self, client: Any, *, limit: int, breaks: int, before_reopen: Callable[[], None]) -> None:
        self._client = client
        self._limit = limit
        self._breaks_left = breaks
        self._before_reopen = before_reopen
        self.ranges: list[str] = []

    def head_object(self, **kwargs: Any) -> Mapping[str, Any]:
        return dict(self._client.head_object(**kwargs))

    def list_objects_v2(self, **kwargs: Any) -> Mapping[str, Any]:
        return dict(self._client.list_objects_v2(**kwargs))

    def get_object(self, **kwargs: Any) -> Mapping[str, Any]:
        if self.ranges:
            self._before_reopen()
        self.ranges.append(kwargs["Range"])
        response = dict(self._client.get_object(**kwargs))
        if self._breaks_left > 0:
            self._breaks_left -= 1
            response["Body"] = BodyThatBreaks(response["Body"], self._limit)
        return response


def test_a_dropped_connection_resumes_at_the_same_byte_and_loses_no_row(
    put_jsonl: PutJsonl, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("intake.input_stores.BODY_RESUME_BASE_DELAY_S", 0.0)
    url = put_jsonl(ROWS)
    flaky = ClientWithFlakyStreams(s3_client, limit=300, breaks=2, before_reopen=lambda: None)
    assert ids_of(read(url, flaky)) == EXPECTED_IDS
    assert flaky.ranges == ["bytes=0-", "bytes=300-", "bytes=600-"]


def test_an_object_overwritten_while_being_read_is_a_source_error_not_a_spliced_read(
    put_jsonl: PutJsonl, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("intake.input_stores.BODY_RESUME_BASE_DELAY_S", 0.0)
    url = put_jsonl(ROWS)

    def overwrite() -> None:
        s3_client.put_object(Bucket=bucket, Key="data.jsonl", Body=b'{"prompt": "new version"}\n')

    flaky = ClientWithFlakyStreams(s3_client, limit=300, breaks=1, before_reopen=overwrite)
    with pytest.raises(SourceError, match="changed while being read"):
        read(url, flaky)


def test_a_connection_that_keeps_dropping_ends_in_a_source_error(
    put_jsonl: PutJsonl, s3_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("intake.input_stores.BODY_RESUME_BASE_DELAY_S", 0.0)
    flaky = ClientWithFlakyStreams(s3_client, limit=0, breaks=100, before_reopen=lambda: None)
    with pytest.raises(SourceError, match="read failed at byte 0 after 5 attempts"):
        read(put_jsonl(ROWS), flaky)


def test_a_message_of_every_format_arrives_from_s3_like_from_disk(
    put_jsonl: PutJsonl, s3_client: Any
) -> None:
    url = put_jsonl([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}])
    (prompt,) = read(url, s3_client)
    assert isinstance(prompt, Prompt) and prompt.messages == [Message(role="user", content="hi")]
