"""A real broker as the leader: its data directory is tapped (set_tap), its Syncer's gate
is the ReplicationServer, and a follower mirrors it over loopback. A publisher confirm
waits for the follower; after the broker stops, the follower's copy equals the leader's
directory, and a broker opened on that copy serves every confirmed message but the acked
ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pika
import pytest

from streamq.cluster.leader import ReplicationServer
from streamq.log.tap import FileTap, set_tap
from tests.cluster.replication_helpers import (
    SECRET,
    Follower,
    MemoryIsrStore,
    Relay,
    eventually,
    tree,
)
from tests.integration.conftest import RunningBroker, drain_bodies, publish_persistent

pytestmark = pytest.mark.timeout(120)


def consume_and_ack(port: int, queue: str, count: int) -> list[bytes]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = connection.channel()
    bodies = []
    for _ in range(count):
        method, _properties, body = channel.basic_get(queue, auto_ack=False)
        assert method is not None
        channel.basic_ack(method.delivery_tag)
        bodies.append(body)
    connection.close()
    return bodies


def remaining(data_dir: Path, queue: str) -> list[bytes]:
    running = RunningBroker(data_dir)
    try:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", running.amqp_port)
        )
        bodies = drain_bodies(connection.channel(), queue)
        connection.close()
        return bodies
    finally:
        running.stop()


async def test_a_broker_mirrored_by_a_follower(tmp_path: Path) -> None:
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    leader_dir.mkdir()
    tap = FileTap(str(leader_dir))
    store = MemoryIsrStore()
    server = ReplicationServer(tap, "leader", SECRET, store, lease_valid=lambda: True)
    set_tap(tap)
    relay = None
    follower = None
    try:
        port = await server.start("127.0.0.1", 0)
        broker = await asyncio.to_thread(RunningBroker, leader_dir)
        assert broker.broker is not None
        broker.broker.syncer.gate = server
        relay = await Relay(port).start()
        follower = Follower(follower_dir, "f1", relay.uri)
        await eventually(lambda: store.isr == {"leader", "f1"})
        bodies = [f"m{i}".encode() for i in range(100)]
        await asyncio.to_thread(publish_persistent, broker.amqp_port, "q", bodies)
        acked = await asyncio.to_thread(consume_and_ack, broker.amqp_port, "q", 30)
        assert acked == bodies[:30]

        # With the follower stalled, a confirm waits for it (ack_timeout_s is 3 s).
        relay.flowing.clear()
        held = asyncio.create_task(
            asyncio.to_thread(publish_persistent, broker.amqp_port, "q", [b"held"])
        )
        await asyncio.sleep(1.0)
        assert not held.done(), "confirmed before the in-sync follower had it"
        relay.flowing.set()
        await asyncio.wait_for(held, 10)
        assert store.isr == {"leader", "f1"}

        await asyncio.to_thread(broker.stop)
        position = tap.position
        await eventually(lambda: follower is not None and follower.client.acked >= position)
        assert tree(follower_dir) == tree(leader_dir)
    finally:
        set_tap(None)
        if follower is not None:
            await follower.stop()
        await server.close()
        if relay is not None:
            await relay.close()
    assert await asyncio.to_thread(remaining, follower_dir, "q") == [*bodies[30:], b"held"]
