"""Fixtures of the integration tier beyond the shared ones (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_head import RedisHead, start_redis_head


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisHead]:
    """The head node's Redis as deployed (TLS, the ACL users), one per test module."""
    root = tmp_path_factory.mktemp("redis-head")
    head = start_redis_head(root, root)
    yield head
    head.stop()
