"""enqueue ends once every replica has its claims, and says so (producer/enqueue/replicas.py)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from producer.enqueue.replicas import (
    CATCH_UP_S,
    ReplicaCatchUp,
    ReplicasUnknown,
    primary_offsets,
    wait_for_replicas,
)


class RoleAnswers:
    """A client whose ROLE answers come from a list, the last one repeated; a clock moved by sleeps."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.now = 0.0

    def execute_command(self, *command: str) -> Any:
        assert command == ("ROLE",)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def primary(offset: int, *acknowledged: int) -> list[Any]:
    return [b"master", offset, [[b"10.0.0.2", b"6380", str(ack).encode()] for ack in acknowledged]]


def waited(client: RoleAnswers) -> ReplicaCatchUp | None:
    return wait_for_replicas(client, clock=lambda: client.now, sleep=client.sleep)


def test_enqueue_waits_until_every_replica_acknowledged_the_offset_its_claims_reached() -> None:
    client = RoleAnswers(primary(500, 400, 400), primary(510, 500, 420), primary(520, 505, 500))
    catch_up = waited(client)
    assert catch_up == ReplicaCatchUp(replicas=2, caught_up=2)
    assert catch_up.line() == "replicated          every claim on 2 of 2 replicas"
    assert catch_up.warning() is None


def test_a_replica_that_does_not_catch_up_is_a_warning_to_re_run_after_a_failover() -> None:
    client = RoleAnswers(primary(500, 400, 100), primary(500, 500, 100))
    catch_up = waited(client)
    assert catch_up == ReplicaCatchUp(replicas=2, caught_up=1)
    assert client.now >= CATCH_UP_S
    warning = catch_up.warning()
    assert warning is not None and "run the same enqueue again" in warning


@pytest.mark.parametrize(
    "reply",
    [
        [b"master", 500, []],  # no replica: nothing to wait for
        [b"slave", b"10.0.0.1", 6380, b"connected", 500],  # not a primary
        [b"master", b"500", []],  # an offset that is no number
        [b"master", 500, [[b"10.0.0.2", b"6380", b"many"]]],  # an acknowledgement that is none
        b"master",
    ],
)
def test_a_server_without_replicas_or_an_unreadable_answer_is_waited_for_by_nobody(reply: Any) -> None:
    assert waited(RoleAnswers(reply)) is None


def test_a_readable_role_reply_gives_the_primary_s_offset_and_each_replica_s() -> None:
    assert primary_offsets(primary(9, 7, 8)) == (9, [7, 8])


class RefusingRole:
    def execute_command(self, *command: str) -> Any:
        raise redis.exceptions.NoPermissionError("this user has no permissions to run the 'role' command")


def test_a_producer_user_refused_role_is_told_what_to_grant_not_a_traceback() -> None:
    with pytest.raises(ReplicasUnknown, match=r"give the producer's user \+role"):
        wait_for_replicas(RefusingRole())


def test_enqueue_ends_with_a_warning_line_when_redis_will_not_say_its_replicas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from producer.enqueue.command import _say_replicated

    _say_replicated(RefusingRole())
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.startswith("warning: Redis refused ROLE") and said.err.count("\n") == 1
