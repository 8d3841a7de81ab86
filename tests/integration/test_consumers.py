"""Consumer priorities (x-priority) and single active consumer, with pika."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, blocked_connection_timeout=10)
    )


def pump(conn: pika.BlockingConnection, done: object) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done() and time.monotonic() < deadline:  # type: ignore[operator]
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.2)  # and nothing more arrives


def test_a_higher_priority_consumer_is_served_first_while_it_has_credit(
    broker: RunningBroker,
) -> None:
    conn = connect(broker)
    setup = conn.channel()
    setup.queue_declare("prio")
    high, low = conn.channel(), conn.channel()
    high.basic_qos(prefetch_count=3)
    low.basic_qos(prefetch_count=100)
    got: dict[str, list[bytes]] = {"high": [], "low": []}
    low.basic_consume("prio", lambda ch, m, p, b: got["low"].append(b))
    high.basic_consume(
        "prio", lambda ch, m, p, b: got["high"].append(b), arguments={"x-priority": 10}
    )
    for n in range(10):
        setup.basic_publish("", "prio", str(n).encode())
    pump(conn, lambda: len(got["high"]) + len(got["low"]) == 10)
    assert got["high"] == [b"0", b"1", b"2"]  # then it is out of credit (never acks)
    assert got["low"] == [str(n).encode() for n in range(3, 10)]
    conn.close()


def test_a_bad_priority_is_406(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("badprio")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_consume("badprio", lambda *a: None, arguments={"x-priority": "high"})
    assert closed.value.reply_code == 406
    conn.close()


def test_single_active_consumer_fails_over_in_subscription_order(broker: RunningBroker) -> None:
    conn = connect(broker)
    channel = conn.channel()
    channel.queue_declare("sac", arguments={"x-single-active-consumer": True})
    got: dict[str, list[bytes]] = {"first": [], "second": []}
    first = channel.basic_consume("sac", lambda ch, m, p, b: got["first"].append(b), auto_ack=True)
    channel.basic_consume("sac", lambda ch, m, p, b: got["second"].append(b), auto_ack=True)
    for n in range(5):
        channel.basic_publish("", "sac", str(n).encode())
    pump(conn, lambda: len(got["first"]) == 5)
    assert (len(got["first"]), got["second"]) == (5, [])
    channel.basic_cancel(first)
    for n in range(5, 8):
        channel.basic_publish("", "sac", str(n).encode())
    pump(conn, lambda: len(got["second"]) == 3)
    assert got["second"] == [b"5", b"6", b"7"]
    assert len(got["first"]) == 5
    conn.close()
