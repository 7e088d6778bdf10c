"""The kombu calls the tests make, typed: kombu 5.7 ships py.typed but leaves these unannotated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.message import Message
from kombu.messaging import Consumer
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import Channel


def connect(url: str, *, transport: str, transport_options: dict[str, Any] | None = None) -> Connection:
    return Connection(url, transport=transport, transport_options=transport_options)


def open_channel(connection: Connection) -> Channel:
    channel: Channel = connection.channel()
    return channel


def release(connection: Connection) -> None:
    connection.release()


def drain_events(connection: Connection, *, timeout: float) -> None:
    connection.drain_events(timeout=timeout)


def exchange(name: str, *, type: str) -> Exchange:
    return Exchange(name, type=type)


def queue(name: str, exchange: Exchange | None = None, **options: Any) -> Queue:
    return Queue(name, exchange, **options)


def declare(declared: Queue) -> None:
    declared.declare()


def get(bound: Queue, *, no_ack: bool | None = None) -> Message | None:
    """The next message of a queue bound to a channel, None if it has none."""
    message: Message | None = bound.get(no_ack=no_ack)
    return message


def consumer(
    connection: Connection, queues: Sequence[Queue], *, callbacks: Sequence[Callable[[Any, Message], object]]
) -> Consumer:
    return Consumer(connection, list(queues), callbacks=list(callbacks))


def requeue(message: Message) -> None:
    message.requeue()


def sweep_bindings(connection: Connection) -> int:
    """The binding tables its default channel swept (kombu's Redis channel)."""
    channel = connection.default_channel
    assert isinstance(channel, kombu_redis.Channel)
    swept: int = channel.sweep_bindings()
    return swept
