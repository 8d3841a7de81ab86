"""What changes while a backup copies the data directory reaches the copy by the replay.

Method: a broker in this process (tests/integration/conftest.py's RunningBroker, with a
stream listener), real clients (pika, rstream, the HTTP API). The backup's copy is held,
once every file has been copied and before the sync point, by wrapping
`TreeCopier.run`: so every change the clients make meanwhile (confirmed publishes that
roll stream segments, a delayed message, acks, a queue deleted and one declared, an
offset stored, a user and a policy) is in files copied before it, and only the changes
the tap recorded, replayed over the copy, can bring it there. A broker started on the
copy must have all of it. Without the replay this test fails.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from rstream import Consumer

from streamq.broker import backup_files
from tests.integration.conftest import RunningBroker

HOST = "127.0.0.1"
TIMEOUT_S = 30
STREAM = "s"
DELAY_MS = 4000  # due after the sync point: the copy holds it in its delayed file


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(HOST, broker.amqp_port))


def publish(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str,
            first: int, count: int) -> None:  # fmt: skip
    for n in range(first, first + count):
        channel.basic_publish("", queue, b"%d" % n)


async def store_offset_and_resume(
    broker: RunningBroker, offset: int, resume: threading.Event
) -> None:
    """Store `offset`, then at once let the backup go on to its sync point."""
    consumer = Consumer(HOST, broker.stream_port, username="guest", password="guest")
    await consumer.start()
    try:
        await consumer.store_offset(STREAM, "app", offset)
        resume.set()
        assert await consumer.query_offset(STREAM, "app") == offset
    finally:
        await consumer.close()


async def query_offset(broker: RunningBroker) -> int:
    consumer = Consumer(HOST, broker.stream_port, username="guest", password="guest")
    await consumer.start()
    try:
        return int(await consumer.query_offset(STREAM, "app"))
    finally:
        await consumer.close()


@pytest.fixture
def held_copy(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(copied, resume): `copied` is set once the copy of the tree is done; it then waits
    for `resume`."""
    copied, resume = threading.Event(), threading.Event()
    run = backup_files.TreeCopier.run

    def held(self: backup_files.TreeCopier) -> backup_files.CopyCounts:
        counts = run(self)
        copied.set()
        assert resume.wait(TIMEOUT_S), "the test never resumed the backup"
        return counts

    monkeypatch.setattr(backup_files.TreeCopier, "run", held)
    yield copied, resume
    resume.set()


def test_changes_made_during_the_copy_are_replayed_into_it(
    tmp_path: Path, held_copy: tuple[threading.Event, threading.Event]
) -> None:
    copied, resume = held_copy
    broker = RunningBroker(tmp_path / "data", stream_port=0)
    target = tmp_path / "backup"
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)
        channel.queue_declare("gone", durable=True)
        arguments = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 4096}
        channel.queue_declare(STREAM, durable=True, arguments=arguments)
        publish(channel, "q", 0, 10)
        publish(channel, "gone", 0, 5)
        publish(channel, STREAM, 0, 200)
        delayed = {"x-delayed-type": "direct"}
        channel.exchange_declare("later", "x-delayed-message", durable=True, arguments=delayed)
        channel.queue_declare("later.q", durable=True)
        channel.queue_bind("later.q", "later", "k")

        answers: list[tuple[int, object]] = []
        backup = threading.Thread(target=lambda: answers.append(
            broker.http("POST", "/api/backup", {"directory": str(target)})[:2]))  # fmt: skip
        backup.start()
        assert copied.wait(TIMEOUT_S), "the copy did not finish"
        # Every file is copied: what follows reaches the copy only by the replay.
        publish(channel, "q", 10, 50)
        channel.queue_delete("gone")
        channel.queue_declare("new", durable=True)
        publish(channel, "new", 0, 5)
        publish(channel, STREAM, 200, 400)  # a dozen segments more
        held = pika.BasicProperties(delivery_mode=2, headers={"x-delay": DELAY_MS})
        channel.basic_publish("later", "k", b"delayed", held)  # confirmed once stored
        assert broker.http("PUT", "/api/users/bob", {"password": "pw", "tags": ""})[0] < 300
        policy = {"pattern": "^new$", "definition": {"max-length": 100}, "apply-to": "queues"}
        assert broker.put_policy("cap", policy) < 300
        # Last, and with no reply that waits for the disk: acks and a stored offset, each
        # written by the next round of its log (the sync point's first round, here).
        for _ in range(3):
            method, _properties, _body = channel.basic_get("q")
            assert method is not None
            channel.basic_ack(method.delivery_tag)
        channel.queue_declare("q", passive=True)  # the acks were processed
        asyncio.run(store_offset_and_resume(broker, 250, resume))
        connection.close()
        backup.join(TIMEOUT_S)
        assert answers and answers[0][0] == 200, answers
    finally:
        broker.stop()

    restored = RunningBroker(target, stream_port=0)
    try:
        check_restored(restored)
    finally:
        restored.stop()


def check_restored(broker: RunningBroker) -> None:
    connection = connect(broker)
    channel = connection.channel()
    bodies = []
    while (got := channel.basic_get("q", auto_ack=True))[0] is not None:
        bodies.append(int(got[2]))
    assert bodies == list(range(3, 60))
    assert channel.queue_declare("new", passive=True).method.message_count == 5
    assert channel.queue_declare(STREAM, passive=True).method.message_count == 600
    deadline = time.monotonic() + TIMEOUT_S
    while (got := channel.basic_get("later.q", auto_ack=True))[0] is None:
        assert time.monotonic() < deadline, "the delayed message never came"
        time.sleep(0.05)
    assert got[2] == b"delayed"
    connection.close()
    gone = broker.http("GET", "/api/queues/%2F/gone")[0]
    assert gone == 404
    assert asyncio.run(query_offset(broker)) == 250
    assert broker.http("GET", "/api/users/bob")[0] == 200
    status, policy, _ = broker.http("GET", "/api/policies/%2F/cap")
    assert status == 200 and isinstance(policy, dict) and policy["pattern"] == "^new$"


def test_one_backup_at_a_time(
    tmp_path: Path, held_copy: tuple[threading.Event, threading.Event]
) -> None:
    copied, resume = held_copy
    broker = RunningBroker(tmp_path / "data")
    try:
        answers: list[tuple[int, object]] = []
        first = {"directory": str(tmp_path / "first")}
        backup = threading.Thread(
            target=lambda: answers.append(broker.http("POST", "/api/backup", first)[:2])
        )
        backup.start()
        assert copied.wait(TIMEOUT_S), "the copy did not finish"
        status, body, _ = broker.http("POST", "/api/backup", {"directory": str(tmp_path / "b")})
        assert status == 409 and isinstance(body, dict), body
        assert body["reason"] == f"a backup into {tmp_path / 'first'} is already running"
        assert not (tmp_path / "b").exists()
        resume.set()
        backup.join(TIMEOUT_S)
        assert answers and answers[0][0] == 200, answers
        status, body, _ = broker.http("POST", "/api/backup", {"directory": "relative"})
        assert status == 400 and isinstance(body, dict), body
        assert "must be an absolute path" in body["reason"]
    finally:
        broker.stop()
