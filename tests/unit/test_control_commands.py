"""A worker answers only the questions reviewed as harmless, and takes no revoked task id from the network:
neither from a `hello` another node broadcasts, nor from the replies to its own (mingle)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery.worker import state as worker_state
from celery.worker.consumer.mingle import Mingle
from celery.worker.control import Panel

from workers.control_commands import ANSWERED_QUESTIONS, HARMLESS_CONTROL_COMMANDS, limit_remote_control

QUEUED_TASK_ID = "0f0f0f0f-0000-4000-8000-000000000000"  # a task id any node can read in the queue
INSPECT = "inspect"
REFUSED_QUESTIONS = frozenset({"memdump", "memsample", "objgraph"})  # a file, memory on demand, debugging


@pytest.fixture
def limited() -> Iterator[list[str]]:
    """Remote control limited as in a worker, Celery's own handlers given back after the test."""
    handlers, on_revoked = dict(Panel.data), Mingle.on_revoked_received
    worker_state.revoked.clear()
    try:
        yield limit_remote_control()
    finally:
        Panel.data.clear()
        Panel.data.update(handlers)
        Mingle.on_revoked_received = on_revoked
        worker_state.revoked.clear()


def a_worker(hostname: str = "gen0-0@node-a") -> SimpleNamespace:
    """What a remote-control handler is given: the worker's name and app (its clock)."""
    clock = SimpleNamespace(forward=lambda: 7, adjust=lambda other: 7, value=7)
    return SimpleNamespace(hostname=hostname, app=SimpleNamespace(clock=clock))


def test_every_question_celery_asks_was_reviewed_and_the_unreviewed_ones_are_refused(
    limited: list[str],
) -> None:
    questions = {name for name, meta in Panel.meta.items() if meta.type == INSPECT}
    assert questions == ANSWERED_QUESTIONS | REFUSED_QUESTIONS  # a question a new Celery adds fails here
    commands = {name for name, meta in Panel.meta.items() if meta.type != INSPECT}
    assert set(limited) == REFUSED_QUESTIONS | (commands - HARMLESS_CONTROL_COMMANDS)


def test_a_refused_question_is_refused_under_its_alias_too(limited: list[str]) -> None:
    for name in limited:
        alias = Panel.meta[name].alias
        reply = Panel.data[name](a_worker())
        assert "refused" in reply["error"]
        if alias:
            assert Panel.data[alias] is Panel.data[name]


def test_a_hello_from_another_node_revokes_nothing_and_is_told_no_revoked_ids(limited: list[str]) -> None:
    reply = Panel.data["hello"](a_worker(), from_node="evil@gpu-b", revoked=[QUEUED_TASK_ID])
    assert QUEUED_TASK_ID not in worker_state.revoked
    assert reply == {"revoked": [], "clock": 7}


def test_celerys_own_hello_would_have_revoked_the_task() -> None:
    handlers = dict(Panel.data)
    worker_state.revoked.clear()
    try:
        Panel.data["hello"](a_worker(), from_node="evil@gpu-b", revoked=[QUEUED_TASK_ID])
        assert QUEUED_TASK_ID in worker_state.revoked
    finally:
        worker_state.revoked.clear()
        Panel.data.update(handlers)


def test_the_replies_to_a_starting_worker_s_hello_revoke_nothing(limited: list[str]) -> None:
    starting = SimpleNamespace(app=a_worker().app, controller=SimpleNamespace(state=worker_state))
    Mingle.__new__(Mingle).on_node_reply(starting, "evil@gpu-b", {"clock": 3, "revoked": [QUEUED_TASK_ID]})
    assert QUEUED_TASK_ID not in worker_state.revoked
