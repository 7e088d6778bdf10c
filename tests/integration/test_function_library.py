"""The protocol's scripts as one Redis function library, on a real redis-server: loaded by the first call
that needs it, once per version, side by side with other versions, and a user that may not load it is
told what to run."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from workers.errors import FunctionsMissing
from workers.recovery.leases import Acquired, LeaseKeeper
from workers.state.function_library import FunctionLibrary
from workers.state.protocol import LIBRARY, Scripts

pytestmark = pytest.mark.integration

CALLER = "fcall-only"
CALLER_PASSWORD = "caller-password"


def url_of_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def fcall_only_client(redis_client: redis.Redis, redis_url: str) -> Iterator[redis.Redis]:
    """A user who may call functions and touch every key, but not load functions."""
    redis_client.acl_setuser(
        CALLER, enabled=True, passwords=[f"+{CALLER_PASSWORD}"], commands=["+@all", "-function"], keys=["~*"]
    )
    yield redis.Redis.from_url(url_of_user(redis_url, CALLER, CALLER_PASSWORD))
    redis_client.acl_deluser(CALLER)


def loaded_libraries(client: redis.Redis) -> set[str]:
    """FUNCTION LIST: one flat list of field, value pairs per library."""
    return {
        dict(zip(entry[::2], entry[1::2], strict=True))[b"library_name"].decode()
        for entry in client.function_list()
    }


def test_the_first_call_on_a_redis_without_the_functions_loads_them(redis_client: redis.Redis) -> None:
    redis_client.function_flush()

    assert not Scripts.register(redis_client).release_lock(keys=["draftgen:r:upload_lock"], args=["token"])

    assert LIBRARY.name in loaded_libraries(redis_client)


def test_loading_a_library_that_is_there_already_is_no_error(redis_client: redis.Redis) -> None:
    LIBRARY.load(redis_client)

    assert LIBRARY.load(redis_client) is False


def test_another_version_of_the_library_has_another_name_and_both_answer(redis_client: redis.Redis) -> None:
    changed = FunctionLibrary.of(
        "draftgen",
        [
            dataclasses.replace(script, body=script.body + "\n-- the next version")
            if script.name == "release_lock"
            else script
            for script in LIBRARY.scripts
        ],
    )
    LIBRARY.load(redis_client)
    changed.load(redis_client)

    assert changed.name != LIBRARY.name
    for library in (LIBRARY, changed):
        assert library.bind(redis_client, "release_lock")(keys=["draftgen:r:upload_lock"], args=["t"]) == 0


def test_a_user_that_may_not_load_the_functions_is_told_what_to_run(
    redis_client: redis.Redis, fcall_only_client: redis.Redis
) -> None:
    redis_client.function_flush()

    with pytest.raises(FunctionsMissing, match="run `python -m producer load-functions`"):
        LeaseKeeper(fcall_only_client, worker="w").acquire("r", "b0")


def test_a_user_that_may_not_load_them_calls_them_once_the_producer_has(
    redis_client: redis.Redis, fcall_only_client: redis.Redis
) -> None:
    redis_client.function_flush()
    LIBRARY.load(redis_client)

    acquired, _lease = LeaseKeeper(fcall_only_client, worker="w").acquire("r", "b0")

    assert acquired is Acquired.FINISHED  # no batch b0: the answer of the function, not an error


class DeletedAfterLoading(redis.Redis):  # type: ignore[misc]  # redis-py is not followed
    """A client whose loads another process undoes, the first `times` times (a FUNCTION DELETE or FLUSH
    landing between a load and the call after it)."""

    times = 0

    def function_load(self, *args: object, **kwargs: object) -> object:
        loaded = super().function_load(*args, **kwargs)
        if DeletedAfterLoading.times > 0:
            DeletedAfterLoading.times -= 1
            self.function_delete(LIBRARY.name)
        return loaded


def test_a_call_whose_functions_are_deleted_again_right_after_it_loaded_them_loads_them_again(
    redis_url: str,
) -> None:
    DeletedAfterLoading.times = 1
    client = DeletedAfterLoading.from_url(redis_url)
    client.function_flush()

    lease = LeaseKeeper(client, worker="w").acquire("a-run", "no-such-batch")

    assert lease[0] is Acquired.FINISHED and LIBRARY.name in loaded_libraries(client)


def test_functions_deleted_every_time_they_are_loaded_are_missing_not_a_redis_error(redis_url: str) -> None:
    DeletedAfterLoading.times = 100
    client = DeletedAfterLoading.from_url(redis_url)
    client.function_flush()

    with pytest.raises(FunctionsMissing, match="again each time they were loaded"):
        LeaseKeeper(client, worker="w").acquire("a-run", "no-such-batch")
