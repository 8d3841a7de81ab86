"""The stream clients' quirks of test_client_quirks.py, run with rstream against a real
RabbitMQ (3.10, with its stream plugin, on loopback ports of its own) and against
streamq: the client must see the same on both (the differential scenarios' RabbitMQ runs
no stream plugin). The Node stream client 1.0 does not work with RabbitMQ 3.10 (the
broker closes it during its setup, and it cannot decode that Close), so it is tested
against streamq only, in test_client_quirks.py.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from rstream import AMQPMessage, CompressionType, ConfirmationStatus, OffsetType

from tests.differential.peers import RabbitMQServer, free_port
from tests.integration.conftest import RunningBroker
from tests.stream.conftest import HOST, Clients, send_confirmed, subscribe
from tests.stream.test_client_quirks import CLOSE_SEEN_S
from tests.stream.test_rstream_publish import query_sequence, with_id

LIST_TIMEOUT_S = 15.0  # RabbitMQ lists a connection once its stats were emitted (5 s)


@dataclass(frozen=True)
class StreamPeer:
    name: str
    stream_port: int
    http_port: int


@pytest.fixture(scope="module")
def rabbitmq_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamPeer]:
    port = free_port()
    server = RabbitMQServer(
        tmp_path_factory.mktemp("rabbitmq-stream"),
        plugins=("rabbitmq_stream", "rabbitmq_stream_management"),
        # Advertised as the clients dial it, as the streamq brokers of the tests are.
        extra_config=f"stream.listeners.tcp.1 = 127.0.0.1:{port}\n"
        "stream.advertised_host = 127.0.0.1\n",
    )
    try:
        yield StreamPeer("rabbitmq", port, server.http_port)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def streamq_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamPeer]:
    running = RunningBroker(tmp_path_factory.mktemp("streamq-stream") / "data", stream_port=0)
    try:
        yield StreamPeer("streamq", running.stream_port, running.http_port)
    finally:
        running.stop()


@pytest.fixture(params=["rabbitmq", "streamq"])
def peer(request: pytest.FixtureRequest) -> StreamPeer:
    found: StreamPeer = request.getfixturevalue(f"{request.param}_stream")
    return found


class Peer(RunningBroker):
    """What `Clients` needs of a broker: its stream listener (no broker of ours runs)."""

    def __init__(self, peer: StreamPeer) -> None:  # no super(): nothing to start
        self.listeners = [("stream", HOST, peer.stream_port)]


def api(peer: StreamPeer, method: str, path: str) -> tuple[int, object]:
    conn = http.client.HTTPConnection(HOST, peer.http_port, timeout=10)
    token = base64.b64encode(b"guest:guest").decode()
    try:
        conn.request(method, path, headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    return response.status, json.loads(data) if data.startswith((b"[", b"{")) else None


async def test_ids_0_1_2_of_a_new_reference_are_stored_on_both(peer: StreamPeer) -> None:
    clients = Clients(Peer(peer))
    stream = f"zero-{time.monotonic_ns()}"
    try:
        sender = await clients.producer()
        await sender.create_stream(stream)
        assert await query_sequence(sender, stream, "fresh") == 0
        messages = [with_id(b"m%d" % n, n) for n in range(3)]
        await send_confirmed(sender, stream, messages, publisher_name="fresh")
        assert await query_sequence(sender, stream, "fresh") == 2
        received = await subscribe(await clients.consumer(), stream, OffsetType.FIRST)
        await received.wait(3)
        assert received.bodies() == [b"m0", b"m1", b"m2"]
    finally:
        await clients.close()


async def test_a_small_segment_size_is_accepted_by_both(peer: StreamPeer) -> None:
    clients = Clients(Peer(peer))
    stream = f"small-{time.monotonic_ns()}"
    try:
        sender = await clients.producer()
        await sender.create_stream(stream, arguments={"stream-max-segment-size-bytes": 1000})
        await send_confirmed(sender, stream, [b"x" * 200] * 20)
        received = await subscribe(await clients.consumer(), stream, OffsetType.FIRST)
        await received.wait(20)
        assert received.bodies() == [b"x" * 200] * 20
    finally:
        await clients.close()


async def test_rstream_gzip_sub_entry_batches_are_stored_and_read_on_both(
    peer: StreamPeer,
) -> None:
    """rstream's compressed sub-entry batches (gzip: the codec it has) are confirmed and
    read back as their messages, in order, on both brokers."""
    clients = Clients(Peer(peer))
    stream = f"gzip-{time.monotonic_ns()}"
    batches = [[AMQPMessage(body=b"b%d-m%d" % (b, m)) for m in range(b + 2)] for b in range(3)]
    confirmed: list[ConfirmationStatus] = []
    done = asyncio.Event()

    async def on_confirm(status: ConfirmationStatus) -> None:
        confirmed.append(status)
        if len(confirmed) == len(batches):
            done.set()

    try:
        sender = await clients.producer()
        await sender.create_stream(stream)
        for batch in batches:
            await sender.send_sub_entry(
                stream, batch, CompressionType.Gzip, on_publish_confirm=on_confirm
            )
        await asyncio.wait_for(done.wait(), 15)
        assert all(status.is_confirmed for status in confirmed)
        expected = [bytes(m.body) for batch in batches for m in batch]
        received = await subscribe(await clients.consumer(), stream, OffsetType.FIRST)
        await received.wait(len(expected))
        assert received.bodies() == expected
    finally:
        await clients.close()


def close_stream_connections(peer: StreamPeer) -> int:
    """DELETE the stream connections the management API lists (RabbitMQ lists one once
    its stats were emitted); how many."""
    # RabbitMQ 3.10 lists them under /api/stream/connections (its stream management
    # plugin), streamq in /api/connections too.
    listing = "/api/stream/connections" if peer.name == "rabbitmq" else "/api/connections"
    deadline = time.monotonic() + LIST_TIMEOUT_S
    found: list[tuple[str, str]] = []
    while not found and time.monotonic() < deadline:
        _, listed = api(peer, "GET", listing)
        assert isinstance(listed, list)
        found = [
            (c["vhost"], c["name"])
            for c in listed
            if peer.name == "rabbitmq" or c.get("protocol") == "RabbitMQ Stream"
        ]
        time.sleep(0.2)
    for vhost, name in found:
        quoted = urllib.parse.quote(name, safe="")
        path = f"{listing}/{urllib.parse.quote(vhost, safe='')}/{quoted}"
        if peer.name == "streamq":
            path = f"{listing}/{quoted}"
        status, _ = api(peer, "DELETE", path)
        assert status == 204, (path, status)
    return len(found)


async def test_rstream_sees_a_management_close_on_both(peer: StreamPeer) -> None:
    closed = asyncio.Event()
    clients = Clients(Peer(peer))
    stream = f"closed-{time.monotonic_ns()}"
    try:
        sender = await clients.producer(on_close_handler=lambda _info: closed.set())
        await sender.create_stream(stream)
        await send_confirmed(sender, stream, [b"before"])
        assert await asyncio.to_thread(close_stream_connections, peer) >= 1
        await asyncio.wait_for(closed.wait(), CLOSE_SEEN_S)
    finally:
        await clients.close()
