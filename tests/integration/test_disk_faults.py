"""Disk faults on the message log of a vhost, injected per file by an LD_PRELOAD shim
(tests/eio_shim.c) into a real `streamq serve` process driven by pika.

- EIO on fsync of the segments: the log fails loudly (an ERROR line naming the log and
  the error), and nothing published after the failed fsync is confirmed; a restart
  (fault gone) has every message confirmed before it.
- EIO on reading a segment (after a restart, so that nothing is served from memory): the
  consumer of the message that cannot be read gets a clear error (404 naming the offset
  and the I/O error) and only its queue is affected: another vhost's queue, publishing
  and consuming, goes on, and so does the broker.
"""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

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


def publish_confirmed(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int) -> None:
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


def test_eio_on_fsync_fails_the_log_loudly_and_confirms_nothing_after(
    tmp_path: Path, shim: EioShim
) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir)
    confirmed_after = []
    refusal: pika.exceptions.AMQPError | None = None
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)
        for n in range(CONFIRMED):
            publish_confirmed(channel, "q", n)
        shim.fail(syncs=True)
        for n in range(CONFIRMED, CONFIRMED + AFTER_FAULT):
            try:
                publish_confirmed(channel, "q", n)
            except pika.exceptions.AMQPError as exc:
                refusal = exc  # not confirmed: the connection is closed with the reason
                break
            confirmed_after.append(n)
        shim.fail()
    finally:
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
