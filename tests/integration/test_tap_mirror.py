"""The file tap against a real broker: its action stream rebuilds the data directory.

Method: a broker runs in-process with a tap on its data directory while a thread applies
the tap's stream, as it comes, to a second directory (as a follower does). A workload
touches every kind of file the broker writes: the message log and its segments, queue
journals (with a compaction), a stream with small segments and retention, stream
offsets, delayed messages, definitions, policies, users and permissions, vhosts created
and deleted. After a clean stop the two trees must be identical, byte for byte, except
the node's own files (LOCAL_FILES). The padding of direct-I/O segment writes is never
recorded and a clean stop cuts it, so there is no exception for segments. Then the copy
opens as a broker with the same queues, messages, users and policies; opened with
`failover=True`, its classic-queue messages come back redelivered.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from streamq.broker.broker import Broker
from streamq.log.tap import LOCAL_FILES, ActionApplier, FileTap, set_tap
from tests.integration.conftest import RunningBroker

READ_BYTES_MAX = 1 << 20


class Mirror:
    """Applies a tap's stream to `directory` on a thread, as it comes."""

    def __init__(self, tap: FileTap, directory: Path) -> None:
        self.tap = tap
        self.applier = ActionApplier(str(directory))
        self.position = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        tap.listener = self._wake.set
        self._thread = threading.Thread(target=self._run, name="tap-mirror", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.wait(0.05)
                self._wake.clear()
                self.drain()
        except BaseException as exc:
            self.error = exc

    def drain(self) -> None:
        while data := self.tap.read(self.position, READ_BYTES_MAX):
            self.applier.feed(data)
            self.position += len(data)
            self.tap.trim(self.position)
        self.applier.sync()
        assert self.applier.applied == self.position

    def finish(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive()
        if self.error is not None:
            raise self.error
        self.drain()
        self.applier.close()


def tree(root: Path) -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = {}
    for directory, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if relative.split(os.sep)[0] in LOCAL_FILES:
                continue
            found[relative] = None if os.path.isdir(path) else Path(path).read_bytes()
    return found


@pytest.fixture
def tapped_broker(tmp_path: Path) -> Iterator[tuple[RunningBroker, Mirror, Path, Path]]:
    source, copy = tmp_path / "source", tmp_path / "copy"
    tap = FileTap(str(source))
    set_tap(tap)
    mirror = Mirror(tap, copy)
    broker = None
    try:
        broker = RunningBroker(source)
        yield broker, mirror, source, copy
    finally:
        if broker is not None:
            broker.stop()
        set_tap(None)
        mirror.finish()


def workload(rb: RunningBroker) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rb.amqp_port))
    channel = connection.channel()
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    channel.queue_declare("kept", durable=True)
    for i in range(600):
        channel.basic_publish("", "kept", b"kept-%d-" % i + b"x" * (i % 7 * 300), persistent)
    for _ in range(250):  # consume and ack part of it, in the journal as deliver/ack runs
        method, _, _ = channel.basic_get("kept")
        assert method is not None
        channel.basic_ack(method.delivery_tag)
    assert rb.broker is not None
    journal = rb.broker.vhosts["/"].queues["kept"].cursor.journal
    assert journal is not None
    rb.ask(journal.request_compaction)  # the rename a compaction ends with, on the mirror too
    channel.basic_publish("", "kept", b"after-compaction", persistent)

    channel.queue_declare("gone", durable=True)
    channel.basic_publish("", "gone", b"doomed", persistent)
    channel.queue_delete("gone")

    stream_args = {
        "x-queue-type": "stream",
        "x-max-length-bytes": 60_000,
        "x-stream-max-segment-size-bytes": 20_000,
    }
    channel.queue_declare("events", durable=True, arguments=stream_args)
    for i in range(400):
        channel.basic_publish("", "events", b"event-%d-" % i + b"e" * 500, persistent)
    consume_stream(channel, "events", 20)

    channel.exchange_declare(
        "later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
    )
    channel.queue_bind("kept", "later", "k")
    delayed = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 3_600_000})
    channel.basic_publish("later", "k", b"in an hour", delayed)
    connection.close()

    assert rb.put_policy("limits", {"pattern": "^kept$", "definition": {"max-length": 100000}})
    assert rb.http("PUT", "/api/users/alice", {"password": "pw", "tags": ""})[0] == 201
    assert rb.http("PUT", "/api/vhosts/v2")[0] == 201
    assert rb.http(
        "PUT", "/api/permissions/v2/alice", {"configure": ".*", "write": ".*", "read": ".*"}
    )[0] in (201, 204)
    assert rb.http("PUT", "/api/vhosts/v3")[0] == 201
    publish_in(rb, "v2", "v2q", b"in v2")
    publish_in(rb, "v3", "v3q", b"in v3, deleted")
    assert rb.http("DELETE", "/api/vhosts/v3")[0] == 204
    # Created again: the same paths as the deleted one's (the mirror may still hold
    # descriptors of those files).
    assert rb.http("PUT", "/api/vhosts/v3")[0] == 201
    publish_in(rb, "v3", "v3q", b"in v3 again")


def publish_in(rb: RunningBroker, vhost: str, queue: str, body: bytes) -> None:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", rb.amqp_port, vhost)
    )
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    connection.close()


def consume_stream(
    channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, count: int
) -> None:
    """Read and ack `count` records of a stream from the first, under a named consumer
    (its offset is tracked in the stream's offsets file)."""
    channel.basic_qos(prefetch_count=50)
    deliveries = channel.consume(
        queue, arguments={"x-stream-offset": "first"}, inactivity_timeout=10
    )
    for got, (method, _, _) in enumerate(deliveries, 1):
        assert method is not None, "stream records did not arrive"
        channel.basic_ack(method.delivery_tag)
        if got == count:
            break
    channel.cancel()


def snapshot(data_dir: Path, *, failover: bool = False) -> dict[str, object]:
    """What a broker opened on `data_dir` holds: queues with message counts, users,
    vhosts, policies; and whether the first message of `kept` comes back redelivered."""
    broker = Broker(str(data_dir), failover=failover)
    try:
        queues = {
            (name, q): (
                vhost.queues[q].cursor.message_count
                if vhost.queues[q].stream is None
                else vhost.queues[q].stream.log.next_offset
            )
            for name, vhost in broker.vhosts.items()
            for q in vhost.queues
        }
        first = broker.vhosts["/"].queues["kept"].cursor.take()
        return {
            "queues": queues,
            "users": sorted(u.name for u in broker.accounts.list_users()),
            "vhosts": sorted(broker.accounts.list_vhosts()),
            "policies": sorted(broker.vhosts["/"].policies),
            "delayed": len(broker.vhosts["/"].delayed),
            "first_redelivered": None if first is None else first.redelivered,
        }
    finally:
        broker.close()


def test_the_tap_stream_rebuilds_the_data_directory(
    tapped_broker: tuple[RunningBroker, Mirror, Path, Path],
) -> None:
    rb, mirror, source, copy = tapped_broker
    workload(rb)
    deadline = time.monotonic() + 10
    while mirror.position < mirror.tap.position:  # the mirror keeps up while it runs
        assert time.monotonic() < deadline
        time.sleep(0.01)
    rb.stop()
    set_tap(None)
    mirror.finish()
    assert mirror.tap.first_retained == mirror.position  # trimmed as it went

    source_tree, copy_tree = tree(source), tree(copy)
    assert sorted(copy_tree) == sorted(source_tree)
    differing = [p for p in source_tree if source_tree[p] != copy_tree[p]]
    assert differing == []
    assert any(p.endswith(".seg") for p in source_tree)
    assert any("streams" in p and p.endswith(".idx") for p in source_tree)  # rolled

    expected = snapshot(source)
    assert expected["queues"][("/", "kept")] == 600 - 250 + 1
    assert expected["users"] == ["alice", "guest"]
    assert expected["vhosts"] == ["/", "v2", "v3"]
    assert expected["queues"][("v3", "v3q")] == 1
    assert expected["delayed"] == 1
    assert expected["first_redelivered"] is False
    assert snapshot(copy) == expected
    assert snapshot(copy, failover=True) == {**expected, "first_redelivered": True}
