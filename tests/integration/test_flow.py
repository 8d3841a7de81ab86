"""Publisher flow control: a classic queue whose consumers are all out of credit and whose
ready backlog passes FLOW_READY_HIGH is "in flow"; a connection that publishes to it stops
reading until the queue leaves flow (backlog under FLOW_READY_LOW, consumers gone) or
FLOW_HOLD_MS_MAX passes. Method: lower the marks (module constants read per drain), drive
a real broker with pika publishers and consumers, read the queue's state on the broker's
loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from amqp_gateway import session
from streamq.broker import vhost_delivery as vhost_module
from tests.integration.conftest import RunningBroker

HIGH = 300
LOW = 150
BODY_BYTES = 1024
# What one socket read can carry at most.
READ_MESSAGES = session.READ_BYTES_MAX // BODY_BYTES


@pytest.fixture
def low_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vhost_module, "FLOW_READY_HIGH", HIGH)
    monkeypatch.setattr(vhost_module, "FLOW_READY_LOW", LOW)


@pytest.fixture
def running(tmp_path: Path, low_marks: None) -> Iterator[RunningBroker]:
    started = RunningBroker(tmp_path / "data")
    yield started
    started.stop()


def _queue_state(running: RunningBroker, name: str) -> tuple[int, bool]:
    """(ready messages, in flow) of queue `name` in vhost /."""

    def read() -> tuple[int, bool]:
        queue = running.broker.vhosts["/"].queues[name]
        return queue.cursor.message_count, queue.in_flow

    return running.ask(read)


def _connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def _wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _declare(port: int, name: str) -> None:
    connection = _connect(port)
    connection.channel().queue_declare(name)
    connection.close()


def _fill_past_high(port: int, name: str) -> None:
    """Publish enough (with confirms) for a consumer without credit to put `name` in flow."""
    connection = _connect(port)
    channel = connection.channel()
    channel.confirm_delivery()
    for _ in range(HIGH + 20):  # 10 go to the consumer; HIGH + 10 stay ready
        channel.basic_publish("", name, b"x" * BODY_BYTES)
    connection.close()


def _stalled_consumer(port: int, name: str) -> tuple[pika.BlockingConnection, BlockingChannel]:
    """A consumer with prefetch 10 that never acks: out of credit after 10 deliveries."""
    connection = _connect(port)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume(name, lambda *args: None, consumer_tag="stalled")
    return connection, channel


def test_slow_consumer_keeps_backlog_bounded(running: RunningBroker) -> None:
    port = running.amqp_port
    count = 10_000  # well past the bound below, which a backlog without flow control passes
    _declare(port, "slow")
    received: list[int] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            connection = _connect(port)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=20)

            def on_message(ch: BlockingChannel, method: object, props: object, body: bytes) -> None:
                received.append(int.from_bytes(body[:4], "big"))
                if len(received) % 10 == 0:
                    time.sleep(0.002)  # slower than the publisher
                ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]
                if len(received) == count:
                    ch.stop_consuming()

            channel.basic_consume("slow", on_message)
            channel.start_consuming()
            connection.close()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    def publish() -> None:
        try:
            connection = _connect(port)
            channel = connection.channel()
            for i in range(count):
                channel.basic_publish("", "slow", i.to_bytes(4, "big") * (BODY_BYTES // 4))
            connection.close()
        except BaseException as exc:
            errors.append(exc)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert _wait_for(lambda: bool(running.broker.vhosts["/"].queues["slow"].consumers), 10)
    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    peak = 0
    flowed = False
    deadline = time.monotonic() + 60
    while consumer.is_alive() and time.monotonic() < deadline:
        ready, in_flow = _queue_state(running, "slow")
        peak = max(peak, ready)
        flowed |= in_flow
        time.sleep(0.005)
    consumer.join(1)
    publisher.join(1)
    assert not errors
    assert received == list(range(count))  # every message, in order
    # The read that crosses the high mark is not held (the mark is checked by the drain
    # after it), the next one is: at most two reads past the mark.
    assert peak < HIGH + 2 * READ_MESSAGES
    assert flowed  # the consumer was slower: flow control engaged


def test_consumer_that_never_acks_does_not_stop_publisher(running: RunningBroker) -> None:
    port = running.amqp_port
    _declare(port, "stalled")
    consumer_connection, _ = _stalled_consumer(port, "stalled")
    _fill_past_high(port, "stalled")
    consumer_connection.process_data_events(time_limit=0.1)
    assert _wait_for(lambda: _queue_state(running, "stalled")[1], 10)  # in flow
    connection = _connect(port)
    channel = connection.channel()
    channel.confirm_delivery()
    started = time.monotonic()
    for _ in range(10):  # each waits for its confirm: one read, one hold, each
        channel.basic_publish("", "stalled", b"y" * BODY_BYTES)
    assert time.monotonic() - started < 15
    ready, in_flow = _queue_state(running, "stalled")
    assert in_flow
    assert ready == HIGH + 20  # all HIGH + 30 published; 10 delivered, unacked
    connection.close()
    consumer_connection.close()


def test_cancelling_consumer_releases_held_publisher(
    running: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = running.amqp_port
    _declare(port, "held")
    consumer_connection, consumer_channel = _stalled_consumer(port, "held")
    _fill_past_high(port, "held")
    assert _wait_for(lambda: _queue_state(running, "held")[1], 10)
    monkeypatch.setattr(session, "FLOW_HOLD_MS_MAX", 600_000)  # only leaving flow releases
    confirmed = threading.Event()
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            connection = _connect(port)
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", "held", b"a")  # read, routed to a queue in flow: held
            channel.basic_publish("", "held", b"b")  # not read while held
            confirmed.set()
            connection.close()
        except BaseException as exc:
            errors.append(exc)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    # HIGH + 20 published, 10 delivered and unacked, then "a".
    assert _wait_for(lambda: _queue_state(running, "held")[0] == HIGH + 11, 10)
    assert not confirmed.wait(0.5)  # held: the second publish is not read
    consumer_channel.basic_cancel("stalled")
    assert confirmed.wait(10)
    publisher.join(5)
    assert not errors
    assert not _queue_state(running, "held")[1]  # no consumers: out of flow
    consumer_connection.close()
