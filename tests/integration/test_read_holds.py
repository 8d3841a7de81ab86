"""When a publisher's reading pauses for a delivery drain (amqp_gateway/session.py `_run`).

The event loop reads a socket again at once only after a read that filled its buffer, so
only then must a publisher wait for the drain (publishing and delivering alternate batch
by batch). After a short read the drain runs before the next poll anyway: pausing and
resuming the socket there cost two syscalls per read at low rates.
"""

from __future__ import annotations

import time

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from amqp_gateway import session
from tests.integration.conftest import RunningBroker
from tests.integration.test_publish_runs import TIMEOUT_S, numbered, open_raw, publishes


def record_holds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The reasons of every pause of reading from now on."""
    holds: list[str] = []
    hold = session.AmqpSession._hold

    def recording(handler: session.AmqpSession, reason: str) -> None:
        holds.append(reason)
        hold(handler, reason)

    monkeypatch.setattr(session.AmqpSession, "_hold", recording)
    return holds


def consuming(broker: RunningBroker) -> tuple[BlockingConnection, BlockingChannel, list[bytes]]:
    """A connection consuming queue "q" with auto-ack, and the bodies it receives."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("q")
    received: list[bytes] = []
    channel.basic_consume("q", lambda _ch, _method, _props, body: received.append(body), True)
    return connection, channel, received


def wait_for(connection: BlockingConnection, received: list[bytes], count: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while len(received) < count and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)


def test_a_publisher_with_short_reads_is_never_paused(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds = record_holds(monkeypatch)
    connection, channel, received = consuming(broker)
    sent = numbered("m", 300)
    for body in sent:
        channel.basic_publish("", "q", body)  # one write each: short reads
    wait_for(connection, received, len(sent))
    connection.close()
    assert received == sent
    assert "drain" not in holds


def test_a_read_that_fills_its_buffer_waits_for_the_drain(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds = record_holds(monkeypatch)
    monkeypatch.setattr(session, "READ_BYTES_MAX", 4096)  # read by the connection's handler
    connection, _, received = consuming(broker)
    raw = open_raw(broker.amqp_port)
    sent = [body.ljust(1000, b".") for body in numbered("m", 500)]
    raw.sock.sendall(publishes("", "q", sent))  # 520 KiB in one write: full 4 KiB reads
    wait_for(connection, received, len(sent))
    raw.sock.close()
    connection.close()
    assert received == sent
    assert holds.count("drain") > 0
