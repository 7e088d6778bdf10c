"""Fixtures shared by the integration tier: a real redis-server, a real S3 endpoint over HTTP."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import redis
from moto.server import ThreadedMotoServer

from devstack.local_stack import RedisProcess, free_port, start_redis

# A test run started in the background without job control (nohup, `scripts/test &` in a script) has
# SIGINT ignored, and so would every process a test starts, since an ignored signal stays ignored across
# exec: the tests of Ctrl-C would send it to children that never see it. A handler of our own is reset
# to the default in each child, as a terminal's foreground job has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# scripts/test runs the suite on several pytest processes (`--dist loadgroup --no-loadscope-reorder`): each
# test goes to whichever process is free, in the order below, but for a module with a module-scoped
# fixture (its services started once), whose tests stay together on one process. The suite's longest
# scenarios start first (measured: docs/development.md, "Where the time goes"), so that the short ones
# fill in beside them instead of one long scenario running on alone at the end.
LONGEST_FIRST = (
    "tests/integration/test_poison_trials.py",
    "tests/integration/test_partition.py",
    "tests/integration/test_poison_prompts.py",
    "tests/integration/test_liveness_tail.py",
    "tests/integration/test_failover.py",
    "tests/integration/test_chaos.py",
    "tests/explorer/",
    "tests/integration/",
)
SHARED_SCOPES = frozenset({"module", "package", "class"})

TEST_BUCKET = "draftgen-test"
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server with the shipped config (AOF, noeviction) and its password, on a free port."""
    root = tmp_path_factory.mktemp("redis")
    process: RedisProcess = start_redis(free_port(), root / "data", root)
    yield process.url
    process.stop()


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The session's Redis, emptied before and after the test."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    yield redis_server
    client.flushall()
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server over real HTTP; its URL is also exported as AWS_ENDPOINT_URL for child processes,
    with fake credentials, for the session only (the environment is restored after)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in FAKE_AWS_ENV.items():
            if name not in os.environ:
                patch.setenv(name, value)
        patch.setenv("AWS_ENDPOINT_URL", url)
        yield url
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[str]:
    """A fresh, empty bucket; returns its name."""
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket=TEST_BUCKET)
    yield TEST_BUCKET
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=TEST_BUCKET):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket=TEST_BUCKET, Key=item["Key"])
    s3.delete_bucket(Bucket=TEST_BUCKET)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest scenarios first; a module whose tests share a fixture one xdist group."""
    items.sort(key=start_rank)
    for item in items:
        if shares_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def start_rank(item: pytest.Item) -> int:
    module = item.nodeid.split("::", 1)[0]
    return next(
        (rank for rank, prefix in enumerate(LONGEST_FIRST) if module.startswith(prefix)), len(LONGEST_FIRST)
    )


def shares_fixtures(item: pytest.Item) -> bool:
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is None:
        return False
    return any(d.scope in SHARED_SCOPES for defs in fixtures.name2fixturedefs.values() for d in defs)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    path = tmp_path / "logs"
    path.mkdir()
    return path
