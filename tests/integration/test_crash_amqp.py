"""SIGKILL at random moments through the real AMQP path, 30 times on one data directory.

A broker runs as a child process; a pika client publishes with confirms and consumes with
acks committed in a transaction (tx.commit-ok comes after the acks are on disk). A timer
SIGKILLs the broker at a random moment, the test restarts it on the same directory, and
so on. It checks that the broker always starts, that every confirmed message is delivered
at least once, that no message whose ack was committed is ever delivered again, and that
every body arrives intact.
"""

from __future__ import annotations

import hashlib
import random
import threading
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.broker_process import BrokerProcess

KILLS = 30
QUEUE = "crash"
PUBLISH_BATCH = 20
GET_BATCH = 10
RUN_S = (0.2, 0.8)  # how long each broker lives before its SIGKILL


def body(message_id: str) -> bytes:
    digest = hashlib.sha256(message_id.encode()).hexdigest()[:16]
    return f"{message_id}:{digest}".encode()


def check(payload: bytes) -> str:
    message_id, _, digest = payload.decode().partition(":")
    assert hashlib.sha256(message_id.encode()).hexdigest()[:16] == digest, payload
    return message_id


class Ledger:
    """What the client knows for sure: confirmed, delivered, acked with a committed tx."""

    def __init__(self) -> None:
        self.confirmed: set[str] = set()
        self.delivered: set[str] = set()
        self.committed: set[str] = set()

    def deliver(self, payload: bytes) -> str:
        message_id = check(payload)
        assert message_id not in self.committed, f"{message_id} came back after its ack"
        self.delivered.add(message_id)
        return message_id


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5, blocked_connection_timeout=5)
    )


def one_life(process: BrokerProcess, ledger: Ledger, round_no: int, rng: random.Random) -> None:
    """Publish and consume until the broker is killed under the client."""
    killer = threading.Timer(rng.uniform(*RUN_S), process.process.kill)
    killer.start()
    sequence = 0
    try:
        conn = connect(process.amqp_port)
        publisher = conn.channel()
        publisher.queue_declare(QUEUE, durable=True)
        publisher.confirm_delivery()
        consumer = conn.channel()
        consumer.tx_select()
        while True:
            for _ in range(PUBLISH_BATCH):
                message_id = f"{round_no}-{sequence}"
                sequence += 1
                publisher.basic_publish("", QUEUE, body(message_id))  # returns when confirmed
                ledger.confirmed.add(message_id)
            taken = []
            for _ in range(GET_BATCH):
                method, _, payload = consumer.basic_get(QUEUE)
                if method is None:
                    break
                taken.append(ledger.deliver(payload))
                consumer.basic_ack(method.delivery_tag)
            consumer.tx_commit()  # returns once the acks are durable
            ledger.committed.update(taken)
    except (pika.exceptions.AMQPError, OSError):
        pass  # the kill
    finally:
        killer.cancel()
        process.kill()


@pytest.mark.timeout(300)
def test_nothing_confirmed_or_acked_is_lost_across_30_sigkills(tmp_path: Path) -> None:
    rng = random.Random(20261123)
    ledger = Ledger()
    data_dir = tmp_path / "data"
    for round_no in range(KILLS):
        process = BrokerProcess(data_dir)  # asserts that it starts
        one_life(process, ledger, round_no, rng)
    assert len(ledger.confirmed) > KILLS * PUBLISH_BATCH  # the client did real work
    process = BrokerProcess(data_dir)
    try:
        conn = connect(process.amqp_port)
        channel = conn.channel()
        while True:
            method, _, payload = channel.basic_get(QUEUE, auto_ack=True)
            if method is None:
                break
            ledger.deliver(payload)
        conn.close()
    finally:
        process.stop()
    lost = ledger.confirmed - ledger.delivered
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    # Nothing is delivered that was never published.
    assert all(int(i.split("-")[0]) < KILLS for i in ledger.delivered)
