"""Set-up and clean-up over AMQP (pika) around the runs of `benchmarks/compare.py`.

Owns what `streamq perf` does not do itself: declaring a fanout exchange with its bound
queues, waiting until a queue holds a number of messages, deleting a run's queues and
exchanges so one run does not influence the next, checking that a broker has stream
queues at all, and reading the server's product and version. Every call has a timeout;
a failure becomes `ScenarioError`. It never starts or stops a broker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import pika
import pika.exceptions
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from benchmarks.perf_process import ScenarioError

SOCKET_TIMEOUT_S: Final = 10.0
BLOCKED_TIMEOUT_S: Final = 60.0
DEPTH_POLL_S: Final = 0.25


@contextmanager
def channel(url: str) -> Iterator[BlockingChannel]:
    """A channel on a fresh connection, closed afterwards. Raises `ScenarioError` when
    the broker cannot be reached."""
    parameters = pika.URLParameters(url)
    parameters.socket_timeout = SOCKET_TIMEOUT_S
    parameters.blocked_connection_timeout = BLOCKED_TIMEOUT_S
    try:
        connection = pika.BlockingConnection(parameters)
    except pika.exceptions.AMQPError as exc:
        raise ScenarioError(f"cannot connect for set-up: {exc!r}") from None
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


def declare_fanout(url: str, exchange: str, queues: Sequence[str]) -> None:
    """Declare a durable fanout exchange and durable queues bound to it (as `streamq
    perf` declares its own queue: durable, no arguments)."""
    try:
        with channel(url) as chan:
            chan.exchange_declare(exchange, exchange_type="fanout", durable=True)
            for queue in queues:
                chan.queue_declare(queue, durable=True)
                chan.queue_bind(queue, exchange)
    except pika.exceptions.AMQPError as exc:
        raise ScenarioError(f"fanout set-up failed: {exc!r}") from None


def queue_depth(url: str, queue: str) -> int:
    """The message count of `queue` from a passive declare."""
    with channel(url) as chan:
        return int(chan.queue_declare(queue, passive=True).method.message_count)


def wait_for_depth(url: str, queue: str, depth: int, timeout_s: float) -> None:
    """Return once `queue` holds at least `depth` messages. Raises `ScenarioError` after
    `timeout_s` or when the queue cannot be read."""
    deadline = time.monotonic() + timeout_s
    try:
        while queue_depth(url, queue) < depth:
            if time.monotonic() > deadline:
                raise ScenarioError(f"{queue} did not reach {depth} messages in {timeout_s} s")
            time.sleep(DEPTH_POLL_S)
    except pika.exceptions.AMQPError as exc:
        raise ScenarioError(f"cannot read the depth of {queue}: {exc!r}") from None


def delete_all(url: str, queues: Sequence[str], exchanges: Sequence[str] = ()) -> list[str]:
    """Delete the queues and exchanges, those that exist. Returns the failures (a missing
    entity is not one) rather than raising: clean-up must not hide the run's result."""
    failures: list[str] = []
    targets = [("queue", name) for name in queues] + [("exchange", name) for name in exchanges]
    try:
        with channel(url) as first:
            chan = first
            for kind, name in targets:
                chan = _delete(chan, kind, name, failures)
    except (ScenarioError, pika.exceptions.AMQPError) as exc:
        failures.append(f"clean-up: {exc!r}")
    return failures


def _delete(chan: BlockingChannel, kind: str, name: str, failures: list[str]) -> BlockingChannel:
    """Delete one entity. A 404 closes the channel, so go on with a new one."""
    try:
        if kind == "queue":
            chan.queue_delete(name)
        else:
            chan.exchange_delete(name)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != pika.spec.NOT_FOUND:
            failures.append(f"delete {kind} {name}: {exc.reply_code} {exc.reply_text}")
        return chan.connection.channel()
    return chan


def require_streams(url: str, probe: str) -> None:
    """Raise `ScenarioError` unless the broker has stream queues. A broker without them
    (LavinMQ 1.1.5) takes `x-queue-type: stream` for a classic queue and would be
    measured on one; a stream must be durable, so a broker with streams refuses a
    non-durable one (406), as RabbitMQ and streamq do. The probe queue is deleted."""
    arguments = {"x-queue-type": "stream"}
    try:
        with channel(url) as chan:
            chan.queue_declare(probe, durable=False, arguments=arguments)
            chan.queue_delete(probe)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == pika.spec.PRECONDITION_FAILED:
            return
        raise ScenarioError(f"stream probe: {exc.reply_code} {exc.reply_text}") from None
    except pika.exceptions.AMQPError as exc:
        raise ScenarioError(f"stream probe failed: {exc!r}") from None
    raise ScenarioError("no stream queues: x-queue-type stream made a classic queue")


def server_version(url: str) -> str:
    """'product version' from the server properties of connection.start."""
    try:
        with channel(url) as chan:
            properties = chan.connection._impl.server_properties  # pika keeps them private
    except (ScenarioError, pika.exceptions.AMQPError) as exc:
        return f"unknown ({exc})"
    product = _text(properties.get("product", "unknown"))
    return f"{product} {_text(properties.get('version', ''))}".strip()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
