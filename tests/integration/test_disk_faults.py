"""Disk faults on the message log of a vhost, injected per file by an LD_PRELOAD shim
(tests/eio_shim.c) into a real `streamq serve` process driven by pika.

- EIO on fsync (or on write) of the segments: the log fails loudly (an ERROR line naming the log and
  the error), and nothing published after the failed fsync is confirmed; a restart
  (fault gone) has every message confirmed before it.
- EIO on reading a segment (after a restart, so that nothing is served from memory): the
  consumer of the message that cannot be read gets a clear error (404 naming the offset
  and the I/O error) and only its queue is affected: another vhost's queue, publishing
  and consuming, goes on, and so does the broker.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.eio_shim import EioShim
from tests.integration.broker_process import BrokerProcess

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


def test_eio_on_read_fails_that_read_only(tmp_path: Path, shim: EioShim) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir)
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        for queue in ("a", "b"):
            channel.queue_declare(queue, durable=True)
            for n in range(CONFIRMED):
                publish_confirmed(channel, queue, n)
        connection.close()
    finally:
        broker.stop()
    # Restarted, nothing is in memory: deliveries read the segment files.
    broker = BrokerProcess(data_dir)
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        # The first write after a start reads the segment's last block (direct I/O
        # rewrites it whole): an EIO there is a failed write, which fails the log.
        publish_confirmed(channel, "b", CONFIRMED)
        shim.fail(reads=True)
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.basic_get("a")
        assert refused.value.reply_code == 404
        assert "cannot be read" in refused.value.reply_text
        assert "Input/output error" in refused.value.reply_text
        # Writes go on meanwhile: the log did not fail.
        channel = connection.channel()
        channel.confirm_delivery()
        publish_confirmed(channel, "b", CONFIRMED + 1)
        shim.fail()
        connection.close()
        got = drain(broker, "b")
    finally:
        broker.stop()
    assert got == [f"b:{n}".encode() for n in range(CONFIRMED + 2)]
    log = broker.stderr.decode(errors="replace")
    assert "queue 'a' failed: message at offset 0 cannot be read" in log, log
    assert "has failed" not in log, log
