"""Followers serve stream reads (issue 32, item 4): a three-node cluster on a real etcd,
each node with a stream port; rstream publishes through the leader and consumes from a
follower, which serves the subscription from its own copy (its log says so).

What is checked, each able to fail: Metadata lists the leader and the in-sync followers
as replicas, with their advertised addresses; rstream's Consumer, started on any node,
reads from a replica and gets every confirmed message in order; a follower never
delivers what the leader has not committed (a paused in-sync follower holds the
leader's confirm, and the reading follower, which has the bytes on its disk, delivers
nothing until the confirm is released); after a failover (the leader killed) a new
consumer reads on from where the first one stopped, and gets what the new leader
confirmed too."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Final

import pytest
from rstream import ConfirmationStatus, Consumer, OffsetType, Producer

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, ResponseCode
from streamq.log import format as fmt
from tests.cluster.cluster_nodes import Cluster, ClusterNode
from tests.cluster.conftest import etcd  # noqa: F401 (the etcd fixture)
from tests.cluster.etcd_server import EtcdServer
from tests.differential.peers import free_port
from tests.stream.conftest import CREDENTIALS, HOST, numbered, send_confirmed, subscribe
from tests.stream.test_client_quirks import rbfly_read
from tests.stream.test_gateway_protocol import RawClient
from tests.unit.log.test_log_chunks import frames

LEASE_TTL_S: Final = 3
START_TIMEOUT_S: Final = 60.0
FAILOVER_TIMEOUT_S: Final = LEASE_TTL_S + 30.0
SERVED_HERE: Final = b"served from this node's copy"
UNCOMMITTED_WINDOW_S: Final = 1.0
METADATA_TIMEOUT_S: Final = 10.0  # well within the leader's 3 s ack timeout


def stream_cluster(
    base: Path, etcd_endpoint: str, size: int = 3, *, without_stream_port: int = -1
) -> Cluster:
    """A cluster whose nodes each have a stream port, advertised as 127.0.0.1, but the
    one at index `without_stream_port` (if any)."""
    cluster = Cluster(base, etcd_endpoint, size, lease_ttl_s=LEASE_TTL_S)
    for i, node in enumerate(cluster.nodes):
        port = free_port() if i != without_stream_port else -1
        node.stream_port = port  # type: ignore[attr-defined]  # this test's own attribute
        node.extra = ("--stream-port", str(port), "--stream-advertised-host", HOST)
    return cluster


def stream_port(node: ClusterNode) -> int:
    port: int = node.stream_port  # type: ignore[attr-defined]  # set by stream_cluster
    return port


async def started(client: Any) -> Any:
    await client.start()
    return client


async def metadata_ports(
    node: ClusterNode, stream: str, replicas_expected: int
) -> tuple[int, list[int]]:
    """(leader's port, the replicas' ports) of Metadata asked at `node`, once it lists
    `replicas_expected` replicas (the leader refreshes the registered nodes every 2 s),
    or after METADATA_TIMEOUT_S."""
    consumer = await started(Consumer(HOST, stream_port(node), **CREDENTIALS))
    try:
        client = await consumer.default_client
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while True:
            leader, replicas = await client.query_leader_and_replicas(stream)
            if len(replicas) >= replicas_expected or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert leader.host == HOST and all(replica.host == HOST for replica in replicas)
        return leader.port, sorted(replica.port for replica in replicas)
    finally:
        await consumer.close()


def publish_through(node: ClusterNode, stream: str, bodies: list[bytes]) -> dict[str, str]:
    """Publish `bodies` with raw frames on `node`'s stream port, confirmed; the
    OpenResponse's properties."""
    raw = RawClient(stream_port(node))
    try:
        raw.login()
        opened = raw.last_open
        created = raw.request(c.Create(raw.next_id(), stream, {}))
        assert created == c.Response(Key.CREATE, raw.correlation_id, ResponseCode.OK)
        answer = raw.request(c.DeclarePublisher(raw.next_id(), 7, "", stream))
        assert answer == c.Response(Key.DECLARE_PUBLISHER, raw.correlation_id, ResponseCode.OK)
        messages = tuple(c.PublishedMessage(n, body) for n, body in enumerate(bodies, 1))
        raw.send(c.Publish(7, messages))
        confirm = raw.read_until(c.PublishConfirm)
        assert confirm == c.PublishConfirm(7, tuple(range(1, len(bodies) + 1)))
        return opened
    finally:
        raw.close()


@pytest.mark.timeout(240)
def test_rstream_consumer_reads_confirmed_messages_from_a_follower(
    etcd: EtcdServer,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    with stream_cluster(tmp_path / "cluster", etcd.endpoint) as cluster:
        leader = cluster.start(START_TIMEOUT_S)
        followers = [node for node in cluster.nodes if node is not leader]

        async def scenario() -> None:
            producer = await started(Producer(HOST, stream_port(followers[0]), **CREDENTIALS))
            try:
                await producer.create_stream("events")
                for batch in range(5):
                    await send_confirmed(producer, "events", numbered(200, batch * 200))
                # Publishing on a follower's port: the leader takes and confirms it.
                opened = await asyncio.to_thread(
                    publish_through, followers[0], "raw", [b"r%d" % n for n in range(5)]
                )
                assert opened["advertised_port"] == str(stream_port(followers[0]))
                ports = await metadata_ports(followers[1], "events", 2)
                assert ports == (stream_port(leader), sorted(map(stream_port, followers)))
                # Started at the leader: rstream picks a replica for the subscription.
                consumer = await started(Consumer(HOST, stream_port(leader), **CREDENTIALS))
                try:
                    received = await subscribe(consumer, "events", OffsetType.FIRST)
                    await received.wait(1000)
                    await send_confirmed(producer, "events", numbered(100, 1000))
                    await received.wait(1100)
                    assert received.offsets() == list(range(1100))
                    assert received.bodies() == [b"m%d" % n for n in range(1100)]
                finally:
                    await consumer.close()
                # rbfly reads from the node it is given: here a follower, from its copy.
                served = followers[1].log().count(SERVED_HERE)
                uri = f"rabbitmq-stream://guest:guest@{HOST}:{stream_port(followers[1])}/"
                got = await rbfly_read(uri, "events", 1100)
                assert got == [b"m%d" % n for n in range(1100)]
                assert followers[1].log().count(SERVED_HERE) == served + 1
            finally:
                await producer.close()

        asyncio.run(scenario())
        assert any(SERVED_HERE in node.log() for node in followers), cluster.log_tails()
        assert SERVED_HERE not in leader.log()


@pytest.mark.timeout(240)
def test_a_follower_delivers_nothing_the_leader_has_not_committed(
    etcd: EtcdServer,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    # The node paused has no stream port: Metadata lists `reading` as the only replica,
    # so rstream reads there.
    with stream_cluster(tmp_path / "cluster", etcd.endpoint, without_stream_port=2) as cluster:
        leader = cluster.start(START_TIMEOUT_S)
        reading, paused = cluster.nodes[1:]

        async def scenario() -> None:
            producer = await started(Producer(HOST, stream_port(leader), **CREDENTIALS))
            consumer = await started(Consumer(HOST, stream_port(reading), **CREDENTIALS))
            try:
                await producer.create_stream("events")
                await send_confirmed(producer, "events", numbered(10))
                assert (await metadata_ports(reading, "events", 1))[1] == [stream_port(reading)]
                received = await subscribe(consumer, "events", OffsetType.FIRST)
                await received.wait(10)
                await asyncio.to_thread(paused.pause)
                confirmed = asyncio.Event()

                async def on_confirm(_status: ConfirmationStatus) -> None:
                    confirmed.set()

                await producer.send("events", b"held", on_publish_confirm=on_confirm)
                window_end = time.monotonic() + UNCOMMITTED_WINDOW_S
                while time.monotonic() < window_end and not confirmed.is_set():
                    await asyncio.sleep(0.05)
                    if not confirmed.is_set():
                        # The paused follower holds the confirm: not committed yet.
                        assert len(received.items) == 10, received.offsets()
                assert not confirmed.is_set(), "the paused follower did not hold the confirm"
                # The leader drops the paused follower from the ISR, then confirms.
                await asyncio.wait_for(confirmed.wait(), 30)
                await received.wait(11)
                assert received.bodies()[-1] == b"held"
            finally:
                await consumer.close()
                await producer.close()
                await asyncio.to_thread(paused.resume)

        asyncio.run(scenario())
        assert SERVED_HERE in reading.log(), cluster.log_tails()


@pytest.mark.timeout(300)
def test_reads_continue_after_a_failover(
    etcd: EtcdServer,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    with stream_cluster(tmp_path / "cluster", etcd.endpoint) as cluster:
        leader = cluster.start(START_TIMEOUT_S)
        followers = [node for node in cluster.nodes if node is not leader]

        async def before() -> int:
            producer = await started(Producer(HOST, stream_port(leader), **CREDENTIALS))
            consumer = await started(Consumer(HOST, stream_port(followers[0]), **CREDENTIALS))
            try:
                await producer.create_stream("events")
                await send_confirmed(producer, "events", numbered(300))
                assert len((await metadata_ports(followers[0], "events", 2))[1]) == 2
                received = await subscribe(consumer, "events", OffsetType.FIRST)
                await received.wait(150)
                return max(received.offsets())
            finally:
                await consumer.close()
                await producer.close()

        last_read = asyncio.run(before())
        served_before = followers[0].log().count(SERVED_HERE) + followers[1].log().count(
            SERVED_HERE
        )
        leader.kill()
        new_leader = cluster.wait_leader(FAILOVER_TIMEOUT_S, exclude=(leader,))
        survivor = next(node for node in followers if node is not new_leader)
        cluster.wait_in_sync([new_leader, survivor], FAILOVER_TIMEOUT_S)

        async def after() -> None:
            producer = await started(Producer(HOST, stream_port(new_leader), **CREDENTIALS))
            consumer = await started(Consumer(HOST, stream_port(survivor), **CREDENTIALS))
            try:
                await send_confirmed(producer, "events", numbered(100, 300))
                ports = await metadata_ports(survivor, "events", 1)
                assert ports == (stream_port(new_leader), [stream_port(survivor)])
                received = await subscribe(consumer, "events", OffsetType.OFFSET, last_read + 1)
                await received.wait(400 - last_read - 1)
                assert received.offsets() == list(range(last_read + 1, 400))
                assert received.bodies() == [b"m%d" % n for n in range(last_read + 1, 400)]
            finally:
                await consumer.close()
                await producer.close()

        served_in_before = survivor.log().count(SERVED_HERE)
        asyncio.run(after())
        assert served_before >= 1, cluster.log_tails()
        assert survivor.log().count(SERVED_HERE) == served_in_before + 1, cluster.log_tails()
        # The new leader's writer began an epoch: its chunks' is above the old leader's,
        # in its copy and in the survivor's (the same bytes).
        for node in (new_leader, survivor):
            chunks = chunk_epochs(node.data_dir)
            assert [offset for offset, _ in chunks] == sorted(offset for offset, _ in chunks)
            before_epochs = {epoch for offset, epoch in chunks if offset < 300}
            after_epochs = {epoch for offset, epoch in chunks if offset >= 300}
            assert after_epochs and min(after_epochs) > max(before_epochs), chunks


def chunk_epochs(data_dir: Path) -> list[tuple[int, int]]:
    """(first offset, epoch) of every chunk of the data directory's one stream."""
    segments = sorted(data_dir.glob(f"vhosts/*/streams/*/*{fmt.SEGMENT_SUFFIX}"))
    assert segments, f"no stream segment under {data_dir}"
    return [(h.first_offset, h.epoch) for path in segments for _, h in frames(path)]


@pytest.mark.timeout(240)
def test_a_restarted_follower_serves_a_stream_nobody_writes_to(
    etcd: EtcdServer,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """A follower learns a commit that covers its copy without any write after it joined:
    nothing is written between its restart and the read. (The leader's last released
    round covers the copy; for writes made outside rounds after it, the leader also runs
    an empty round when a follower starts streaming.)"""
    with stream_cluster(tmp_path / "cluster", etcd.endpoint, 2) as cluster:
        leader = cluster.start(START_TIMEOUT_S)
        follower = cluster.nodes[1]

        async def fill() -> None:
            producer = await started(Producer(HOST, stream_port(leader), **CREDENTIALS))
            try:
                await producer.create_stream("idle")
                await send_confirmed(producer, "idle", numbered(20))
            finally:
                await producer.close()

        async def read() -> None:
            assert (await metadata_ports(follower, "idle", 1))[1] == [stream_port(follower)]
            consumer = await started(Consumer(HOST, stream_port(follower), **CREDENTIALS))
            try:
                received = await subscribe(consumer, "idle", OffsetType.FIRST)
                await received.wait(20)
                assert received.bodies() == [b"m%d" % n for n in range(20)]
            finally:
                await consumer.close()

        asyncio.run(fill())
        follower.stop()
        follower.start()
        cluster.wait_in_sync(cluster.nodes, START_TIMEOUT_S)
        asyncio.run(read())
        assert SERVED_HERE in follower.log(), cluster.log_tails()
