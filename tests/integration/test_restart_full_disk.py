"""A restart on a disk that is still full serves every confirmed message, and the
queues it could not tidy up are compacted once space returns, with no restart.

Method: `streamq serve` as a child process on a 40 MB tmpfs (tests/small_fs.py). pika
publishes with confirms to three durable queues, one after the other (so each queue's
journal holds many one-entry blocks: a restart rewrites it), a priority queue among
them, a stream, and two delayed messages (one routed, its removal recorded). One journal, the
vhost's definitions and the delayed-message file get a torn last record (as a crash
leaves). SIGKILL, then the file system is filled to the last byte and the broker started
again: every confirmed message is there (counted and consumed), nothing was rewritten
(the journals keep their size, torn tails are cut in place), each deferred rewrite is
logged, and the vhost is not refused. Then the filler goes: the queues take new
publishes and their journals are compacted by a sync round, with no restart; a last
restart still has every message.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pika

from tests.integration.broker_process import BrokerProcess
from tests.small_fs import fill, free_bytes, small_filesystem

HOST = "127.0.0.1"
TIMEOUT_S = 20
QUEUES = {"plain": {}, "other": {}, "prio": {"x-max-priority": 5}}
MESSAGES = 300  # per queue, one confirm each: 300 blocks in each journal
ACKED = 20
STREAM = "log"  # taken from "plain" and acked before the kill
OPTIONS = ("--disk-free-limit", "1MiB")  # the tmpfs is far below the default limit


def connect(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(HOST, broker.amqp_port, blocked_connection_timeout=TIMEOUT_S)
    )


def journal(data_dir: Path, queue: str) -> Path:
    digest = hashlib.sha1(queue.encode()).hexdigest()
    found = list(data_dir.rglob(f"queues/{digest}.journal"))
    assert len(found) == 1, found
    return found[0]


def publish_all(broker: BrokerProcess) -> None:
    connection = connect(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    # Delayed messages: one routed soon (its removal recorded), one kept for a minute.
    arguments = {"x-delayed-type": "direct"}
    channel.exchange_declare("later", "x-delayed-message", durable=True, arguments=arguments)
    channel.queue_declare("routed", durable=True)
    channel.queue_bind("routed", "later", "k")
    for body, delay_ms in ((b"soon", 50), (b"kept", 60_000)):
        properties = pika.BasicProperties(headers={"x-delay": delay_ms}, delivery_mode=2)
        channel.basic_publish("later", "k", body, properties)
    time.sleep(0.2)  # bounded: "soon" comes due meanwhile
    channel.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    for n in range(MESSAGES):
        channel.basic_publish("", STREAM, f"{STREAM}:{n}".encode())
    for name, arguments in QUEUES.items():
        channel.queue_declare(name, durable=True, arguments=arguments)
        for n in range(MESSAGES):
            properties = pika.BasicProperties(delivery_mode=2, priority=n % 5)
            channel.basic_publish("", name, f"{name}:{n}".encode(), properties, mandatory=True)
    for _ in range(ACKED):
        method, _, _ = channel.basic_get("plain")
        assert method is not None
        channel.basic_ack(method.delivery_tag)
    # A sync round after the acks: the Declare-Ok of a new durable exchange waits for one
    # (a redeclare of an existing queue answers at once).
    channel.exchange_declare("barrier", "fanout", durable=True)
    connection.close()


def bodies(broker: BrokerProcess, name: str) -> set[bytes]:
    """Every message of the queue, taken without acks (they go back on close)."""
    connection = connect(broker)
    channel = connection.channel()
    found = set()
    while True:
        method, _, body = channel.basic_get(name)
        if method is None:
            break
        found.add(body)
    connection.close()
    return found


def stream_bodies(broker: BrokerProcess) -> list[bytes]:
    """The stream's messages from its first, read by an AMQP consumer."""
    connection = connect(broker)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    found = []
    arguments = {"x-stream-offset": "first"}
    for method, _, body in channel.consume(STREAM, arguments=arguments, inactivity_timeout=2):
        if method is None:
            break
        found.append(body)
        channel.basic_ack(method.delivery_tag)
    connection.close()
    return found


def expected(name: str) -> set[bytes]:
    first = ACKED if name == "plain" else 0
    return {f"{name}:{n}".encode() for n in range(first, MESSAGES)}


def until(check: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    assert callable(check)
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_restart_on_a_full_disk_serves_every_confirmed_message(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "fs", "40m") as fs:
        data_dir = fs / "data"
        broker = BrokerProcess(data_dir, *OPTIONS)
        try:
            publish_all(broker)
        finally:
            broker.kill()
        with journal(data_dir, "other").open("ab") as torn:
            torn.write(b"\x05\x00\x00\x00torn")  # a block header cut by the crash
        definitions = next(data_dir.rglob("vhosts/*/definitions"))
        with definitions.open("ab") as torn:
            torn.write(b"\x30\x00")  # a record header cut by the crash
        delayed = next(data_dir.rglob("delayed"))
        with delayed.open("ab") as torn:
            torn.write(b"\x09\x00")  # a record cut by the crash
        sizes = {name: journal(data_dir, name).stat().st_size for name in QUEUES}
        filler = fill(fs / "filler", 0)
        assert free_bytes(fs) == 0

        broker = BrokerProcess(data_dir, *OPTIONS)
        try:
            for name in QUEUES:
                assert bodies(broker, name) == expected(name), name
            # Nothing could be rewritten: the journals are as they were (the torn
            # block cut off in place), and the log says why.
            assert journal(data_dir, "plain").stat().st_size == sizes["plain"]
            assert journal(data_dir, "other").stat().st_size == sizes["other"] - 8
            assert bodies(broker, "routed") == {b"soon"}
            assert stream_bodies(broker) == [f"{STREAM}:{n}".encode() for n in range(MESSAGES)]
            assert b"kept" in delayed.read_bytes() and not delayed.read_bytes().endswith(
                b"\x09\x00"
            )
            assert not definitions.read_bytes().endswith(b"\x30\x00")
            log = broker.stderr.decode(errors="replace")
            assert log.count("no room to rewrite it at start-up") == len(QUEUES), log
            assert "torn tail cut in place" in log, log
            assert "delayed messages: " in log and "not rewritten at start-up" in log, log
            assert "not restored" not in log and "is unavailable" not in log, log

            # Room again: the queues take publishes, and a sync round compacts them.
            filler.unlink()
            connection = connect(broker)
            channel = connection.channel()
            channel.confirm_delivery()
            for name in QUEUES:
                channel.basic_publish("", name, f"{name}:new".encode(), mandatory=True)
            connection.close()
            for name in QUEUES:
                # One block instead of 300 (a priority queue's runs are per message).
                path, before = journal(data_dir, name), sizes[name]
                until(lambda p=path, b=before: p.stat().st_size < b - 2048, f"{name} compacted")
        finally:
            broker.kill()
        broker = BrokerProcess(data_dir, *OPTIONS)
        try:
            for name in QUEUES:
                assert bodies(broker, name) == expected(name) | {f"{name}:new".encode()}
        finally:
            broker.stop()
