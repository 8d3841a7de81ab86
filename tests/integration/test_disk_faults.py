"""Disk faults on the message log of a vhost, injected per file by an LD_PRELOAD shim
(tests/eio_shim.c) into a real `streamq serve` process driven by pika.

- EIO on fsync (or on write) of the segments: the log fails loudly (an ERROR line naming the log and
  the error), and nothing published after the failed fsync is confirmed; a restart
  (fault gone) has every message confirmed before it.
- EIO on reading a segment (after a restart, so that nothing is served from memory): only
  that read fails. The consumer the delivery was for is cancelled (basic.cancel) and a
  basic.get gets 404 naming the offset, the segment and the I/O error; the message stays
  queued, never delivered; the queue's other consumer stays, publishing to the queue
  goes on, and once reads work again every message is delivered, in order.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, OffsetType, ResponseCode
from tests.eio_shim import EioShim
from tests.integration.broker_process import BrokerProcess
from tests.stream.test_gateway_protocol import OK, RawClient

HOST = "127.0.0.1"
TIMEOUT_S = 20
SEGMENTS = "/messages/0"  # the segment files of every vhost's message log
CONFIRMED = 50
AFTER_FAULT = 10


def connect(broker: BrokerProcess, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            HOST, broker.amqp_port, vhost, blocked_connection_timeout=TIMEOUT_S
        )
    )


def publish_confirmed(channel: BlockingChannel, queue: str, n: int) -> None:
    properties = pika.BasicProperties(delivery_mode=2)
    channel.basic_publish("", queue, f"{queue}:{n}".encode(), properties, mandatory=True)


def drain(broker: BrokerProcess, queue: str, vhost: str = "/") -> list[bytes]:
    connection = connect(broker, vhost)
    channel = connection.channel()
    found = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        found.append(body)
    connection.close()
    return found


def write_and_stop(
    data_dir: Path, queues: dict[str, dict[str, object] | None], messages: list[tuple[str, bytes]]
) -> None:
    """A broker on `data_dir` declares `queues` (durable, with their arguments), publishes
    `messages` (queue, body; persistent, mandatory, confirmed) and stops: once restarted it
    holds none of them in memory, so deliveries read the segment files."""
    broker = BrokerProcess(data_dir)
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        for queue, arguments in queues.items():
            channel.queue_declare(queue, durable=True, arguments=arguments)
        properties = pika.BasicProperties(delivery_mode=2)
        for queue, body in messages:
            channel.basic_publish("", queue, body, properties, mandatory=True)
        connection.close()
    finally:
        broker.stop()


@pytest.fixture
def shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EioShim:
    made = EioShim(tmp_path / "shim", SEGMENTS)
    for name, value in made.environment().items():
        monkeypatch.setenv(name, value)  # the broker process inherits them
    return made


@pytest.mark.parametrize("fault", ["syncs", "writes"])
def test_eio_on_fsync_or_write_fails_the_log_loudly_and_confirms_nothing_after(
    tmp_path: Path, shim: EioShim, fault: str
) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir)
    # A publish that is never answered would block pika forever: the kill bounds it
    # (and the test then fails, the connection not being closed with a reason).
    watchdog = threading.Timer(TIMEOUT_S, broker.process.kill)
    watchdog.start()
    confirmed_after = []
    refusal: pika.exceptions.AMQPError | None = None
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)
        for n in range(CONFIRMED):
            publish_confirmed(channel, "q", n)
        shim.fail(syncs=fault == "syncs", writes=fault == "writes")
        for n in range(CONFIRMED, CONFIRMED + AFTER_FAULT):
            try:
                publish_confirmed(channel, "q", n)
            except pika.exceptions.AMQPError as exc:
                refusal = exc  # not confirmed: the connection is closed with the reason
                break
            confirmed_after.append(n)
        shim.fail()
    finally:
        watchdog.cancel()
        broker.kill()
    assert confirmed_after == [], f"confirmed after a failed fsync: {confirmed_after}"
    assert isinstance(refusal, pika.exceptions.ConnectionClosedByBroker), repr(refusal)
    assert refusal.reply_code == 506 and "Input/output error" in refusal.reply_text
    log = broker.stderr.decode(errors="replace")
    assert "ERROR amqp_gateway.publishing: message store failed" in log, log
    assert "Task exception was never retrieved" not in log, log
    again = BrokerProcess(data_dir)
    try:
        got = drain(again, "q")
    finally:
        again.stop()
    assert {f"q:{n}".encode() for n in range(CONFIRMED)} <= set(got)


BIG_BYTES = 300 * 1024  # bigger than a queue's read-ahead: each message is a read of its own
BIG_MESSAGES = 6


def big_body(n: int) -> bytes:
    return f"a:{n}".encode().ljust(BIG_BYTES, b".")


def wait_for(connection: pika.BlockingConnection, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, "timed out"
        connection.process_data_events(time_limit=0.1)


def test_eio_on_read_fails_that_delivery_only(tmp_path: Path, shim: EioShim) -> None:
    data_dir = tmp_path / "data"
    write_and_stop(
        data_dir, {"a": None, "b": None}, [("a", big_body(n)) for n in range(BIG_MESSAGES)]
    )
    broker = BrokerProcess(data_dir)
    try:
        connection = connect(broker)
        publisher = connection.channel()
        publisher.confirm_delivery()
        # The first write after a start reads the segment's last block (direct I/O
        # rewrites it whole): an EIO there is a failed write, which fails the log.
        publish_confirmed(publisher, "b", 0)
        # The queue's other consumer: prefetch 1, it takes a:0 and holds it unacked.
        holder = connection.channel()
        holder.basic_qos(prefetch_count=1)
        held: list[tuple[int, bytes, bool]] = []
        holder.basic_consume(
            "a",
            lambda _, method, __, body: held.append(
                (method.delivery_tag, body, method.redelivered)
            ),
        )
        wait_for(connection, lambda: len(held) == 1)
        shim.fail(reads=True)
        # A new consumer's delivery (a:1) cannot be read: it is cancelled, and gets nothing.
        failing = connection.channel()
        cancelled: list[str] = []
        failing.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        got: list[bytes] = []
        tag = failing.basic_consume("a", lambda _, __, ___, body: got.append(body))
        wait_for(connection, lambda: bool(cancelled))
        assert cancelled == [tag] and got == []
        # basic.get: its channel is closed with the reason, the message stays queued.
        getter = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            getter.basic_get("a")
        assert refused.value.reply_code == 404
        for words in ("cannot be read", "Input/output error", "stays queued", ".seg at position"):
            assert words in refused.value.reply_text, refused.value.reply_text
        # Publishing goes on, to that queue too.
        publisher.basic_publish("", "a", big_body(BIG_MESSAGES), mandatory=True)
        publish_confirmed(publisher, "b", 1)
        shim.fail()
        # Reads work again: the holder acks and receives the rest, in order, none lost.
        holder.basic_ack(held[0][0])
        for count in range(2, BIG_MESSAGES + 2):
            wait_for(connection, partial(lambda n: len(held) >= n, count))
            holder.basic_ack(held[-1][0])
        connection.close()
        others = drain(broker, "b")
    finally:
        broker.stop()
    assert [body for _, body, _ in held] == [big_body(n) for n in range(BIG_MESSAGES + 1)]
    assert not any(redelivered for _, _, redelivered in held)  # none went out before
    assert others == [b"b:0", b"b:1"]
    log = broker.stderr.decode(errors="replace")
    assert "cannot be read: reading segment" in log, log
    assert f"its consumer '{tag}' cancelled, the message stays queued" in log, log
    assert "failed: message" not in log and "has failed" not in log, log


@pytest.fixture
def stream_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EioShim:
    made = EioShim(tmp_path / "shim", "/streams/")  # every stream's files
    for name, value in made.environment().items():
        monkeypatch.setenv(name, value)
    return made


def test_eio_on_a_stream_read_cancels_that_consumer_only(
    tmp_path: Path, stream_shim: EioShim
) -> None:
    data_dir = tmp_path / "data"
    bodies = [("s", big_body(n)) for n in range(BIG_MESSAGES)]
    write_and_stop(data_dir, {"s": {"x-queue-type": "stream"}}, bodies)
    broker = BrokerProcess(data_dir)
    try:
        connection = connect(broker)
        publisher = connection.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("", "s", big_body(BIG_MESSAGES))  # the first write reads back
        first = {"x-stream-offset": "first"}
        holder = connection.channel()
        holder.basic_qos(prefetch_count=1)
        held: list[tuple[int, bytes]] = []
        holder.basic_consume(
            "s",
            lambda _, method, __, body: held.append((method.delivery_tag, body)),
            arguments=first,
        )
        wait_for(connection, lambda: len(held) == 1)
        stream_shim.fail(reads=True)
        failing = connection.channel()
        failing.basic_qos(prefetch_count=10)
        cancelled: list[str] = []
        failing.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        got: list[bytes] = []
        # From offset 1: the chunk of offset 0, which the holder's read just brought in, is
        # kept decoded in memory (the log's last few chunks) and served without a read.
        second = {"x-stream-offset": 1}
        tag = failing.basic_consume(
            "s", lambda _, __, ___, body: got.append(body), arguments=second
        )
        wait_for(connection, lambda: bool(cancelled))
        assert cancelled == [tag] and got == []
        publisher.basic_publish("", "s", big_body(BIG_MESSAGES + 1))  # appends go on
        stream_shim.fail()
        for count in range(2, BIG_MESSAGES + 3):
            holder.basic_ack(held[-1][0])
            wait_for(connection, partial(lambda n: len(held) >= n, count))
        connection.close()
    finally:
        broker.stop()
    assert [body for _, body in held] == [big_body(n) for n in range(BIG_MESSAGES + 2)]
    log = broker.stderr.decode(errors="replace")
    assert "queue 's': message at offset 1 cannot be read: reading segment" in log, log
    assert f"its consumer '{tag}' cancelled" in log, log
    assert "failed: its log failed" not in log, log


def test_eio_on_a_stream_protocol_read_ends_that_subscription_only(
    tmp_path: Path, stream_shim: EioShim
) -> None:
    data_dir = tmp_path / "data"
    bodies = [("s", f"s:{n}".encode()) for n in range(CONFIRMED)]
    write_and_stop(data_dir, {"s": {"x-queue-type": "stream"}}, bodies)
    broker = BrokerProcess(data_dir)
    try:
        port = re.search(rb"stream=127\.0\.0\.1:(\d+)", broker.stderr)
        assert port is not None, broker.stderr
        client = RawClient(int(port[1]))
        client.login()
        connection = connect(broker)
        publisher = connection.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("", "s", b"after restart")  # the first write reads back
        stream_shim.fail(reads=True)
        first = c.OffsetSpec(OffsetType.FIRST)
        assert client.request(c.Subscribe(1, 1, "s", first, 10)) == c.Response(Key.SUBSCRIBE, 1, OK)
        assert client.read() == c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, "s")
        publisher.basic_publish("", "s", b"during the fault")  # the stream goes on
        stream_shim.fail()
        # Subscribing again (as clients do on that update) reads everything.
        assert client.request(c.Subscribe(2, 2, "s", first, 10)) == c.Response(Key.SUBSCRIBE, 2, OK)
        deliver = client.read_until(c.Deliver)
        assert isinstance(deliver, c.Deliver) and deliver.subscription_id == 2
        client.close()
        connection.close()
    finally:
        broker.stop()
    log = broker.stderr.decode(errors="replace")
    assert "stream 's': subscription 1 from offset 0 ended: reading segment" in log, log
    assert "Input/output error" in log and "Traceback" not in log, log


def test_eio_while_dead_lettering_a_rejected_message_keeps_it_queued(
    tmp_path: Path, shim: EioShim
) -> None:
    data_dir = tmp_path / "data"
    dead_letters: dict[str, object] = {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dl",
    }
    write_and_stop(data_dir, {"dl": None, "d": dead_letters}, [("d", b"d:0")])
    broker = BrokerProcess(data_dir)
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        publish_confirmed(channel, "dl", 0)  # the first write after a start reads back
        method, _, body = channel.basic_get("d")
        assert method is not None and body == b"d:0" and not method.redelivered
        shim.fail(reads=True)
        channel.basic_reject(method.delivery_tag, requeue=False)  # its copy cannot be read
        channel.queue_declare("dl", durable=True)  # a round trip: the reject was handled
        shim.fail()
        again = None
        deadline = time.monotonic() + TIMEOUT_S
        while again is None:  # the queue reads again after its retry interval
            assert time.monotonic() < deadline, "the rejected message is gone"
            again, _, body = channel.basic_get("d")
            time.sleep(0.1)
        assert body == b"d:0" and again.redelivered  # back in the queue, not lost
        channel.basic_reject(again.delivery_tag, requeue=False)  # now it is dead-lettered
        connection.close()
        got = drain(broker, "dl")
    finally:
        broker.stop()
    assert got == [b"dl:0", b"d:0"]
    log = broker.stderr.decode(errors="replace")
    assert "queue 'd': message at offset" in log and "Input/output error" in log, log
