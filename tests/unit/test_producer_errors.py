"""`python -m producer` reports one tree: what the layers below raise lands on the branch saying the same."""

from __future__ import annotations

import redis

from core.exit_codes import EXIT_FAILED, EXIT_USAGE
from producer.errors import (
    OutputUnavailable,
    RedisUnavailable,
    RunStateBroken,
    UsageError,
    as_producer_error,
)
from workers.errors import InvalidRunName, ObjectMissing, StoreUnavailable

REDIS_URL = "redis://:s3cret@redis.internal:6379/0"


def test_a_redis_failure_names_where_redis_was_looked_for_without_the_password() -> None:
    error = as_producer_error(redis.ConnectionError("Connection refused"), redis_url=REDIS_URL)

    assert isinstance(error, RedisUnavailable)
    assert str(error) == "Redis at redis://***@redis.internal:6379/0: Connection refused"
    assert (error.exit_code, error.retry_helps) == (EXIT_FAILED, True)


def test_an_unreachable_bucket_is_a_failure_a_retry_can_fix_with_a_hint_about_credentials() -> None:
    error = as_producer_error(
        StoreUnavailable("s3://bucket/runs: AccessDenied", delay_s=5), redis_url=REDIS_URL
    )

    assert isinstance(error, OutputUnavailable)
    assert "check the AWS credentials" in str(error)
    assert (error.exit_code, error.retry_helps) == (EXIT_FAILED, True)


def test_a_refused_name_is_a_usage_error_a_retry_cannot_fix() -> None:
    error = as_producer_error(InvalidRunName("run name 'a/b' has a '/'"), redis_url=REDIS_URL)

    assert isinstance(error, UsageError)
    assert (str(error), error.exit_code, error.retry_helps) == ("run name 'a/b' has a '/'", EXIT_USAGE, False)


def test_a_missing_object_reads_without_the_quotes_a_key_error_adds() -> None:
    error = as_producer_error(ObjectMissing("data/part-1.parquet"), redis_url=REDIS_URL)

    assert isinstance(error, RunStateBroken)
    assert str(error) == "data/part-1.parquet"
    assert error.exit_code == EXIT_FAILED
