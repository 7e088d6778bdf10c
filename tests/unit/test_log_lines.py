"""A Redis restart is a line per event in a worker's log, not a chain of tracebacks."""

from __future__ import annotations

import io
import logging

import redis

from workers.log_lines import RecoverableOneLine, one_line_for_recoverable_errors

REFUSED = "Error 111 connecting to 127.0.0.1:6390. Connection refused."


def logged(error: BaseException, message: str = "Error on restarting %s") -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger(f"test-log-lines-{id(stream)}")
    logger.propagate = False
    logger.addHandler(handler)
    one_line_for_recoverable_errors(logger)
    try:
        raise error
    except BaseException:
        logger.exception(message, "Gossip")
    return stream.getvalue()


def chained_gossip_error() -> AttributeError:
    """What Celery logged on a Redis restart: an AttributeError raised while handling a lost connection."""
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as refused:
            raise redis.ConnectionError(
                "Error 111 connecting to 127.0.0.1:6390. Connection refused."
            ) from refused
    except redis.ConnectionError:
        try:
            raise AttributeError("'NoneType' object has no attribute 'connection_errors'")
        except AttributeError as error:
            return error


def test_an_error_whose_chain_holds_a_lost_connection_is_one_line_naming_it() -> None:
    text = logged(chained_gossip_error())
    assert text == f"Error on restarting Gossip [ConnectionError: {REFUSED}; recoverable, retried]\n"


def test_any_other_error_keeps_its_traceback() -> None:
    text = logged(KeyError("a bug"), "failed: %s")
    assert text.startswith("failed: Gossip\nTraceback (most recent call last):")
    assert "KeyError: 'a bug'" in text


def test_the_filter_is_added_once_however_often_celery_sets_logging_up() -> None:
    logger = logging.getLogger("test-log-lines-once")
    handler = logging.StreamHandler(io.StringIO())
    logger.addHandler(handler)
    one_line_for_recoverable_errors(logger)
    one_line_for_recoverable_errors(logger)
    assert sum(isinstance(f, RecoverableOneLine) for f in handler.filters) == 1
