"""The whole pipeline as real processes: redis-server, simulated GPUs over HTTP, Celery workers, uploader.

Each test reads like what a user does: enqueue a dataset, let it run, verify the output.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import datasets as hf_datasets
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from core.records import Quality
from devstack.local_stack import free_port
from inference.simulator import SimulatorProcess, count_prompt_tokens, predict_outcome
from tests.support import prompt_files
from tests.support.stack import Stack, deployed_server, simulators
from workers.record.manifest import completion_keys, read_manifest
from workers.record.storage import open_store
from workers.state.keys import RunKeys
from workers.state.ledger import RunLedger
from workers.state.runs import decode_run_settings

pytestmark = pytest.mark.integration

SPEEDUP = 400.0
CONTEXT_LENGTH = 40_000
PROMPTS_PER_FORMAT = 200


@pytest.fixture(scope="module")
def stack(redis_server: str, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # s3_endpoint first: the workers inherit AWS_ENDPOINT_URL from this process when they start
    redis_url = redis_server.rsplit("/", 1)[0] + "/1"
    redis.Redis.from_url(redis_url).flushdb()
    sims = simulators(2, speedup=SPEEDUP, context_length=CONTEXT_LENGTH, request_log_size=20_000)
    running = Stack(redis_url, tmp_path_factory.mktemp("logs"), sims).start()
    yield running
    running.stop()
    for sim in sims:
        sim.stop()


def committed_rows(stack: Stack, run: str) -> list[dict[str, Any]]:
    settings = decode_run_settings(redis.Redis.from_url(stack.redis_url).get(RunKeys(run).settings))
    store = open_store(settings.output)
    rows: list[dict[str, Any]] = []
    for key in completion_keys(read_manifest(store)):
        rows.extend(pq.read_table(io.BytesIO(store.get(key))).to_pylist())
    return rows


def generations_per_prompt(sims: list[SimulatorProcess], run: str) -> Counter[str]:
    """Requests each prompt got answered with (status ok), counted at the servers by rid."""
    counts: Counter[str] = Counter()
    for sim in sims:
        for record in sim.admin.requests():
            if record.status == "ok" and record.rid.startswith(run + ":"):
                counts[record.rid.split(":")[1]] += 1
    return counts


FORMATS = {
    "messages-jsonl": lambda tmp, rows: prompt_files.write_jsonl(
        tmp / "d.jsonl", [prompt_files.as_messages(r) for r in rows]
    ),
    "prompt-jsonl": lambda tmp, rows: prompt_files.write_jsonl(
        tmp / "d.jsonl", [prompt_files.as_prompt(r) for r in rows]
    ),
    "sharegpt-jsonl": lambda tmp, rows: prompt_files.write_jsonl(
        tmp / "d.jsonl", [prompt_files.as_sharegpt(r) for r in rows]
    ),
    "parquet": lambda tmp, rows: prompt_files.write_parquet(
        tmp / "d.parquet", [prompt_files.as_messages(r) for r in rows]
    ),
    "hf-folder": lambda tmp, rows: prompt_files.write_hf_folder(
        tmp / "hf", [prompt_files.as_prompt(r) for r in rows]
    ),
}


@pytest.mark.parametrize("input_format", list(FORMATS))
def test_a_few_hundred_prompts_run_end_to_end_in_each_format(
    stack: Stack, tmp_path: Path, input_format: str
) -> None:
    # Given a dataset of 200 prompts in this format
    data = FORMATS[input_format](tmp_path, prompt_files.questions(PROMPTS_PER_FORMAT, input_format))
    run = f"e2e-{input_format}"
    # When it is enqueued and the workers finish
    output = stack.enqueue(data, run, "--output", str(tmp_path / "out"))
    assert f"new                 {PROMPTS_PER_FORMAT} prompts" in output
    stack.wait_finished(run)
    # Then verify passes, every prompt has one record with reasoning and an answer, from both GPUs
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = committed_rows(stack, run)
    assert len(rows) == PROMPTS_PER_FORMAT
    assert {row["prompt_id"] for row in rows} == {f"{input_format}-{i}" for i in range(PROMPTS_PER_FORMAT)}
    assert all(row["reasoning_content"] and row["content"] for row in rows)
    assert {row["origin"]["gpu"] for row in rows} == {0, 1}


def test_a_finished_run_carries_exact_token_ids_and_exports_for_both_trainers_from_redis_s_record(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a finished run
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_messages(r) for r in prompt_files.questions(60, "ids")]
    )
    stack.enqueue(data, "ids", "--output", str(tmp_path / "out"))
    stack.wait_finished("ids")
    # Then every row holds the server's ids, as many as its usage says, and names its server's facts
    rows = committed_rows(stack, "ids")
    assert all(len(row["prompt_token_ids"]) == row["usage"]["prompt_tokens"] for row in rows)
    assert all(len(row["response_token_ids"]) == row["usage"]["completion_tokens"] for row in rows)
    servers = {row["origin"]["server_url"]: row["origin"]["server"] for row in rows}
    assert len(set(servers.values())) == len(stack.sims) == 2  # one record per server
    for url, identity in servers.items():
        facts = json.loads((tmp_path / "out" / "servers" / f"{identity}.json").read_text())
        assert facts["server_url"] == url and facts["version"] == "0.5.23"
        assert facts["context_length"] == CONTEXT_LENGTH
    # And it exports for both trainers, the output found through Redis, the rows read by datasets
    for fmt in ("speculators", "specforge"):
        result = stack.producer("export", "--run", "ids", "--format", fmt, "--to", str(tmp_path / fmt))
        assert result.returncode == 0, result.stdout + result.stderr
        loaded = hf_datasets.load_dataset("json", data_dir=str(tmp_path / fmt / "data"), split="train")
        ok = sum(row["quality"] == Quality.OK.value for row in rows)
        assert loaded.num_rows == ok > 0
    assert "without token ids" not in stack.producer("status", "--run", "ids").stdout


def test_the_configured_sampling_fields_arrive_at_the_server(stack: Stack, tmp_path: Path) -> None:
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(20, "sampling")]
    )
    run = "e2e-sampling"
    stack.enqueue(
        data,
        run,
        "--output",
        str(tmp_path / "out"),
        "--temperature",
        "0.7",
        "--top-p",
        "0.8",
        "--top-k",
        "40",
        "--min-p",
        "0.05",
        "--max-tokens",
        "20000",
        "--model",
        "qwen-test",
        "--seed",
        "7",
    )
    stack.wait_finished(run)
    received = [r for sim in stack.sims for r in sim.admin.requests() if r.rid.startswith(run + ":")]
    assert len(received) == 20
    for request in received:
        assert request.max_completion_tokens == 20000
        assert request.sampling["temperature"] == 0.7
        assert request.sampling["top_p"] == 0.8
        assert request.sampling["top_k"] == 40
        assert request.sampling["min_p"] == 0.05
        assert request.sampling["seed"] == 7
        assert request.sampling["chat_template_kwargs"] == {"enable_thinking": True}
    assert {row["model"] for row in committed_rows(stack, run)} == {"qwen-test"}


def test_quality_labels_match_each_truncation_case(stack: Stack, tmp_path: Path) -> None:
    # Given prompts whose outcome under a 3000-token budget the simulator's model predicts
    budget = 3000
    sim_settings = deployed_server(context_length=CONTEXT_LENGTH)
    rows = prompt_files.questions(120, "quality")
    expected: dict[str, Quality] = {}
    for row in rows:
        outcome = predict_outcome(sim_settings, [{"role": "user", "content": row["question"]}], budget)
        if outcome.finish_reason == "length" and outcome.content_empty:
            expected[str(row["id"])] = Quality.TRUNCATED_IN_THINKING
        elif outcome.finish_reason == "length":
            expected[str(row["id"])] = Quality.TRUNCATED_IN_ANSWER
        else:
            expected[str(row["id"])] = Quality.OK
    assert set(expected.values()) == set(Quality) - {Quality.EMPTY_ANSWER, Quality.NO_REASONING}
    data = prompt_files.write_jsonl(tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in rows])
    # When they run
    run = "e2e-quality"
    stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--max-tokens", str(budget))
    stack.wait_finished(run)
    # Then each record carries the label its outcome deserves
    labels = {str(row["prompt_id"]): Quality(row["quality"]) for row in committed_rows(stack, run)}
    assert labels == expected


def test_enqueue_re_run_mid_run_and_after_the_end_duplicates_nothing(stack: Stack, tmp_path: Path) -> None:
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(150, "rerun")]
    )
    run = "e2e-rerun"
    stack.enqueue(data, run, "--output", str(tmp_path / "out"))
    mid_run = stack.enqueue(data, run)
    assert "new                 0 prompts" in mid_run
    stack.wait_finished(run)
    after = stack.enqueue(data, run)
    assert "already there       150" in after
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout
    assert set(generations_per_prompt(stack.sims, run).values()) == {1}


def test_bad_rows_are_reported_and_every_other_row_completes(stack: Stack, tmp_path: Path) -> None:
    too_long = "word " * (CONTEXT_LENGTH + 10)
    assert count_prompt_tokens([{"role": "user", "content": too_long}]) > CONTEXT_LENGTH
    good = [prompt_files.as_prompt(r) for r in prompt_files.questions(30, "bad")]
    rows: list[object] = [
        *good[:10],
        '{"id": "broken", "prompt": ',
        {"id": "no-messages"},
        {"id": "wrong-type", "messages": [{"role": "user", "content": 42}]},
        {"id": "empty", "prompt": "   "},
        {"id": "too-long", "prompt": too_long},
        *good[10:],
    ]
    data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
    run = "e2e-bad-rows"
    output = stack.enqueue(data, run, "--output", str(tmp_path / "out"), "--max-tokens", "4096")
    # The four malformed rows are refused at enqueue, by line number and reason
    assert "rejected rows       4" in output
    for line_number in (11, 12, 13, 14):
        assert f"row {line_number}: " in output
    stack.wait_finished(run)
    # The over-long prompt is dead-lettered with the server's reason; everything else is committed
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout
    assert "committed         30" in result.stdout and "dead-lettered     1" in result.stdout
    (letter,) = RunLedger(redis.Redis.from_url(stack.redis_url), run).dead_letters()
    assert (letter.prompt_id, letter.row, letter.reason) == ("too-long", 15, "rejected_by_server")
    assert "longer than the model's context length" in letter.error


def test_the_output_alone_proves_a_run_complete_and_rebuilds_its_dead_letters_and_rejected_rows(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a finished run with a rejected row and a dead-lettered prompt
    rows: list[object] = [
        *(prompt_files.as_prompt(r) for r in prompt_files.questions(20, "record")),
        '{"id": "broken", "prompt": ',
        {"id": "too-long", "prompt": "word " * (CONTEXT_LENGTH + 10)},
    ]
    data = prompt_files.write_jsonl(tmp_path / "d.jsonl", rows)
    run, output = "e2e-record", tmp_path / "out"
    stack.enqueue(data, run, "--output", str(output), "--max-tokens", "4096")
    stack.wait_finished(run)
    client = redis.Redis.from_url(stack.redis_url)
    keys = RunKeys(run)
    ledger = RunLedger(client, run)
    before = (ledger.enqueued_ids(), client.hgetall(keys.dead), client.hgetall(keys.rejected))
    # When Redis is out of reach, verify proves it from the output alone
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    alone = stack.producer("verify", "--run", run, "--output", str(output), DRAFTGEN_REDIS_URL=nowhere)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "committed         21" not in alone.stdout and "committed         20" in alone.stdout
    assert "dead-lettered     1 (1 committed to the output)" in alone.stdout
    # And when Redis has lost the run, recover rebuilds its enqueued ids, dead letters and rejected rows
    client.delete(*client.keys(f"draftgen:{run}:*"))
    recovered = stack.producer("recover", "--run", run, "--output", str(output))
    assert recovered.returncode == 0, recovered.stderr
    after = (ledger.enqueued_ids(), client.hgetall(keys.dead), client.hgetall(keys.rejected))
    assert after == before


def test_a_run_commits_to_s3_over_http_and_datasets_and_pandas_read_it(
    stack: Stack, tmp_path: Path, s3_bucket: str
) -> None:
    # Given a run whose output is an S3 bucket (moto's server, reached over HTTP by the workers)
    data = prompt_files.write_jsonl(
        tmp_path / "d.jsonl", [prompt_files.as_prompt(r) for r in prompt_files.questions(120, "s3")]
    )
    run = "e2e-s3"
    stack.enqueue(data, run, "--output", f"s3://{s3_bucket}/runs/{run}")
    stack.wait_finished(run)
    # Then verify passes against the bucket
    result = stack.verify(run)
    assert result.returncode == 0, result.stdout
    # And the committed objects, fetched as `producer files` lists them, load in datasets and pandas
    listed = stack.producer("files", "--run", run)
    locations = listed.stdout.split()
    assert locations and all(loc.startswith(f"s3://{s3_bucket}/runs/{run}/data/") for loc in locations)
    local = []
    s3 = boto3.client("s3")
    for location in locations:
        key = location.removeprefix(f"s3://{s3_bucket}/")
        path = tmp_path / Path(key).name
        s3.download_file(s3_bucket, key, str(path))
        local.append(str(path))
    frame = pd.concat(map(pd.read_parquet, local))
    assert sorted(frame["prompt_id"]) == sorted(f"s3-{i}" for i in range(120))
    dataset = hf_datasets.load_dataset(
        "parquet", data_files=local, split="train", cache_dir=str(tmp_path / "hf")
    )
    assert dataset.num_rows == 120
    assert set(dataset.column_names) >= {"prompt_id", "messages", "reasoning_content", "content", "quality"}


def test_a_parquet_files_own_columns_are_kept_typed_through_the_fleet_into_parquet_and_the_export(
    stack: Stack, tmp_path: Path
) -> None:
    # Given the user's Parquet file: the prompt in `instruction`, and columns of their own
    rows = [
        {"uid": i, "instruction": f"question kept-{i}", "lang": "en" if i % 2 else "fr", "score": i / 4}
        for i in range(40)
    ]
    data = tmp_path / "mine.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    run = "e2e-kept-columns"
    stack.enqueue(
        data, run, "--output", str(tmp_path / "out"), "--prompt-field", "instruction", "--id-field", "uid",
        "--keep-columns", "*",
    )  # fmt: skip
    stack.wait_finished(run)
    # Then every committed row holds them, typed as the input had them, in one struct column
    committed = {row["prompt_id"]: row["columns"] for row in stack.committed_rows(run)}
    assert committed == {str(row["uid"]): {"lang": row["lang"], "score": row["score"]} for row in rows}
    table = pq.read_table(tmp_path / "out" / "data")
    assert table.schema.field("columns").type == pa.struct([("lang", pa.string()), ("score", pa.float64())])
    # And the export's rows carry them beside the conversation, and datasets reads them
    exported = stack.producer("export", "--run", run, "--format", "specforge", "--to", str(tmp_path / "sf"))
    assert exported.returncode == 0, exported.stderr
    loaded = hf_datasets.load_dataset("json", data_dir=str(tmp_path / "sf" / "data"), split="train")
    assert loaded.num_rows == len(rows) and loaded.filter(lambda row: row["lang"] == "en").num_rows == 20
