"""Resource alarms: publishers are blocked with connection.blocked and unblocked when the
alarm clears; consumers keep consuming meanwhile, and nothing published is lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from streamq.broker.resources import ResourceLimits
from tests.integration.conftest import RunningBroker, broker_on

TIMEOUT_S = 10
TERABYTE = 1 << 40


@pytest.fixture
def alarmed_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A broker whose memory limit is 1 byte: the alarm is on from the first check."""
    running = RunningBroker(tmp_path / "data", ResourceLimits(1, 0))
    yield running
    running.stop()


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=60)
    )


def wait_for(connection: pika.BlockingConnection, done: list[object]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done:
        assert time.monotonic() < deadline, "timed out"
        connection.process_data_events(time_limit=0.05)


def test_publishers_are_blocked_until_the_alarm_clears(alarmed_broker: RunningBroker) -> None:
    consumer_conn = connect(alarmed_broker)
    consumer = consumer_conn.channel()
    consumer.queue_declare("alarmed")
    publisher_conn = connect(alarmed_broker)
    blocked: list[object] = []
    unblocked: list[object] = []
    publisher_conn.add_on_connection_blocked_callback(lambda _c, frame: blocked.append(frame))
    publisher_conn.add_on_connection_unblocked_callback(lambda _c, frame: unblocked.append(frame))
    publisher = publisher_conn.channel()
    publisher.basic_publish("", "alarmed", b"first")  # the broker blocks after reading it
    wait_for(publisher_conn, blocked)
    assert blocked[0].method.reason == "low on memory"
    # The consumer's connection has not published: it is not blocked.
    method, _, body = consumer.basic_get("alarmed", auto_ack=True)
    assert method is not None and body == b"first"
    publisher.basic_publish("", "alarmed", b"second")  # sent, but not read while blocked
    consumer_conn.process_data_events(time_limit=0.5)
    assert consumer.basic_get("alarmed", auto_ack=True)[0] is None

    def clear() -> None:
        assert alarmed_broker.broker is not None
        alarmed_broker.broker.resources.limits = ResourceLimits(TERABYTE, 0)

    alarmed_broker.call(clear)
    wait_for(publisher_conn, unblocked)
    deadline = time.monotonic() + TIMEOUT_S
    while (got := consumer.basic_get("alarmed", auto_ack=True))[0] is None:
        assert time.monotonic() < deadline, "the blocked publish never arrived"
        consumer_conn.process_data_events(time_limit=0.05)
    assert got[2] == b"second"
    publisher_conn.close()
    consumer_conn.close()


def test_the_disk_limit_blocks_publishers_too(tmp_path: Path) -> None:
    with broker_on(tmp_path / "data", ResourceLimits(TERABYTE, TERABYTE * 1024)) as running:
        conn = connect(running)
        blocked: list[object] = []
        conn.add_on_connection_blocked_callback(lambda _c, frame: blocked.append(frame))
        conn.channel().basic_publish("", "nowhere", b"x")
        unblocked: list[object] = []
        conn.add_on_connection_unblocked_callback(lambda _c, frame: unblocked.append(frame))
        wait_for(conn, blocked)
        assert blocked[0].method.reason == "low on disk"

        def clear() -> None:
            assert running.broker is not None
            running.broker.resources.limits = ResourceLimits(TERABYTE, 0)

        # A blocked connection is not read, its close included (as RabbitMQ): clear first.
        running.call(clear)
        wait_for(conn, unblocked)
        conn.close()
