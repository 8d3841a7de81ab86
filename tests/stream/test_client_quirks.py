"""What real stream clients trip over (issue 29, item 7), with the clients that showed it:
rstream, rbfly, and RabbitMQ's stream client for Node.js (rabbitmq-stream-js-client,
installed by `npm ci` from tests/stream/node/package-lock.json, driven by
node/stream_client.js).

- A new publisher reference's publishing id 0 is stored (it was dropped as a duplicate).
- A connection closed from the management API ends without a Close frame, which the
  clients expect only as a reply: each sees its connection closed at once, no error.
- Open and Metadata advertise one host, the host name by default (as RabbitMQ, and as
  the management API names the node), or `stream_advertised_host`/`_port`: a client
  behind a load balancer, which compares them to find the leader, agrees.
- A stream declared with a small stream-max-segment-size-bytes (1,000) is accepted, its
  segments rounded up to SEGMENT_BYTES_MIN (RabbitMQ accepts it; it was refused).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from rbfly.streams import Offset, streams_client
from rstream import OffsetType, OnClosedErrorInfo, Producer

from streamq.broker.streams import SEGMENT_BYTES_MIN
from streamq.log.format import SEGMENT_SUFFIX
from tests.integration.conftest import RunningBroker
from tests.node_clients import installed, run_script
from tests.stream.conftest import (
    CREDENTIALS,
    HOST,
    TIMEOUT_S,
    Clients,
    send_confirmed,
    start_broker,
    stream_broker_on,
    stream_port,
    subscribe,
)
from tests.stream.test_rstream_publish import query_sequence, with_id

NODE_DIR = Path(__file__).parent / "node"
NODE_TIMEOUT_S = 60
# A client must see the management API's close well before the broker's own bound
# (stream_gateway.session.CLOSE_TIMEOUT_S, 3 s), which ended the connection of a client
# that could not answer a server's Close.
CLOSE_SEEN_S = 2.0
LIST_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def node_client() -> Path:
    return installed(NODE_DIR, "rabbitmq-stream-js-client") / "stream_client.js"


def run_node(script: Path, *args: str) -> dict[str, object]:
    done = run_script(script, *args, timeout=NODE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


# -- publishing id 0 of a new reference ---------------------------------------------------


async def test_rstream_ids_0_1_2_of_a_new_reference_are_all_stored(clients: Clients) -> None:
    sender = await clients.producer()
    await sender.create_stream("zero")
    assert await query_sequence(sender, "zero", "fresh") == 0  # unknown: 0, as RabbitMQ
    messages = [with_id(b"m%d" % n, n) for n in range(3)]
    statuses = await send_confirmed(sender, "zero", messages, publisher_name="fresh")
    assert sorted(status.message_id for status in statuses) == [0, 1, 2]
    assert all(status.is_confirmed for status in statuses)
    assert await query_sequence(sender, "zero", "fresh") == 2
    # Id 0 again is now a duplicate: confirmed, not stored.
    again = await send_confirmed(sender, "zero", [with_id(b"dup", 0)], publisher_name="fresh")
    assert again[0].is_confirmed
    received = await subscribe(await clients.consumer(), "zero", OffsetType.FIRST)
    await received.wait(3)
    assert (await received.quiet()) and received.bodies() == [b"m0", b"m1", b"m2"]


def test_node_stream_client_ids_0_1_2_of_a_new_reference_are_all_stored(
    broker: RunningBroker, node_client: Path
) -> None:
    result = run_node(node_client, "dedup", str(stream_port(broker)), "node-zero")
    assert result == {"confirmed": [0, 1, 2], "sequence": 2, "stored": ["m0", "m1", "m2"]}


async def rbfly_read(uri: str, stream: str, count: int) -> list[object]:
    """The first `count` messages of `stream` as rbfly reads them."""
    client = streams_client(uri)
    got: list[object] = []

    async def read() -> None:
        async for message in client.subscribe(stream, offset=Offset.FIRST):
            got.append(message)
            if len(got) == count:
                break

    try:
        await asyncio.wait_for(read(), TIMEOUT_S)
    finally:
        await client.disconnect()
    return got


def rbfly_uri(broker: RunningBroker) -> str:
    return f"rabbitmq-stream://guest:guest@{HOST}:{stream_port(broker)}/"


async def test_rbfly_ids_0_1_2_of_a_new_reference_are_all_stored(broker: RunningBroker) -> None:
    client = streams_client(rbfly_uri(broker))
    try:
        await client.create_stream("rbfly-zero")
        async with client.publisher("rbfly-zero", name="fresh") as publisher:
            assert publisher.message_id == 1  # QueryPublisherSequence said 0
            publisher.message_id = 0  # its next publishing id
            for n in range(3):
                await asyncio.wait_for(publisher.send(b"m%d" % n), TIMEOUT_S)
    finally:
        await client.disconnect()
    assert await rbfly_read(rbfly_uri(broker), "rbfly-zero", 3) == [b"m0", b"m1", b"m2"]


# -- closed from the management API -------------------------------------------------------


def close_stream_connections(broker: RunningBroker) -> int:
    """DELETE every stream connection the management API lists; how many."""
    deadline = time.monotonic() + LIST_TIMEOUT_S
    while True:
        status, listed, _ = broker.http("GET", "/api/connections")
        assert status == 200 and isinstance(listed, list)
        names = [item["name"] for item in listed if item["protocol"] == "RabbitMQ Stream"]
        if names or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for name in names:
        quoted = urllib.parse.quote(name, safe="")
        assert broker.http("DELETE", f"/api/connections/{quoted}")[0] == 204
    return len(names)


async def test_rstream_sees_a_management_close_at_once(
    broker: RunningBroker, clients: Clients, caplog: pytest.LogCaptureFixture
) -> None:
    closed = asyncio.Event()
    reasons: list[str] = []

    def on_close(info: OnClosedErrorInfo) -> None:
        reasons.append(info.reason)
        closed.set()

    sender = await clients.producer(on_close_handler=on_close)
    await sender.create_stream("closed")
    await send_confirmed(sender, "closed", [b"before"])
    caplog.set_level(logging.WARNING, logger="rstream")
    assert await asyncio.to_thread(close_stream_connections, broker) >= 1
    await asyncio.wait_for(closed.wait(), CLOSE_SEEN_S)
    assert reasons[0] == "Connection Closed"
    assert not [r for r in caplog.records if "Error while running handler" in r.getMessage()]


async def test_rbfly_reconnects_after_a_management_close(broker: RunningBroker) -> None:
    client = streams_client(rbfly_uri(broker))
    try:
        await client.create_stream("rbfly-closed")
        async with client.publisher("rbfly-closed") as publisher:
            await asyncio.wait_for(publisher.send(b"before"), TIMEOUT_S)
            assert await asyncio.to_thread(close_stream_connections, broker) == 1
            await asyncio.wait_for(publisher.send(b"after"), TIMEOUT_S)
    finally:
        await client.disconnect()
    stored = await rbfly_read(rbfly_uri(broker), "rbfly-closed", 2)
    assert stored == [b"before", b"after"]


def test_node_stream_client_sees_a_management_close_at_once(
    broker: RunningBroker, node_client: Path
) -> None:
    outcome, elapsed = node_sees_its_connection_end(
        broker, node_client, lambda: close_stream_connections(broker) >= 1
    )
    assert outcome == {"outcome": "connection_closed hadError=false", "errors": []}
    assert elapsed < CLOSE_SEEN_S


def test_node_stream_client_sees_the_broker_shut_down(tmp_path: Path, node_client: Path) -> None:
    """The broker's shutdown ends stream connections as a management close does."""
    running = start_broker(tmp_path / "shutdown")
    try:
        outcome, elapsed = node_sees_its_connection_end(
            running, node_client, lambda: running.stop() or True
        )
    finally:
        running.stop()
    assert outcome == {"outcome": "connection_closed hadError=false", "errors": []}
    assert elapsed < CLOSE_SEEN_S


def node_sees_its_connection_end(
    broker: RunningBroker, node_client: Path, end: Callable[[], object]
) -> tuple[dict[str, object], float]:
    """Run the Node client's "closed" scenario: once it is ready, `end()`. What it
    printed, and how long after `end()` it exited."""
    process = subprocess.Popen(
        ["node", str(node_client), "closed", str(stream_port(broker)), "node-closed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        with ThreadPoolExecutor(1) as pool:
            ready = pool.submit(process.stdout.readline).result(NODE_TIMEOUT_S)
        assert ready.strip() == "ready", process.stderr.read() if process.stderr else ""
        started = time.monotonic()
        assert end()
        out, err = process.communicate(timeout=NODE_TIMEOUT_S)
        elapsed = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(NODE_TIMEOUT_S)
    assert process.returncode == 0, err
    result: dict[str, object] = json.loads(out.splitlines()[-1])
    return result, elapsed


# -- the advertised host -------------------------------------------------------------------


@pytest.fixture
def host_name_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A broker that advertises its default: the host name (the tests' other brokers
    advertise 127.0.0.1, which the clients dial)."""
    with stream_broker_on(tmp_path / "host-name", stream_advertised_host="") as running:
        yield running


async def test_the_default_advertised_host_is_the_node_host_name(
    host_name_broker: RunningBroker,
) -> None:
    """rstream in load-balancer mode dials 127.0.0.1 and keeps the connection whose
    advertised host and port are Metadata's leader: they agree, and name the host the
    management API names, whether or not the host name resolves here."""
    clients = Clients(host_name_broker)
    try:
        await advertised_host_name(host_name_broker, clients)
    finally:
        await clients.close()


async def advertised_host_name(host_name_broker: RunningBroker, clients: Clients) -> None:
    port = stream_port(host_name_broker)
    sender = await clients.start(
        Producer(HOST, port, **CREDENTIALS, load_balancer_mode=True)  # type: ignore[arg-type]
    )
    await sender.create_stream("advertised")
    locator = await sender.default_client
    leader, _replicas = await locator.query_leader_and_replicas("advertised")
    assert (leader.host, leader.port) == (socket.gethostname(), port)
    assert locator.server_properties is not None
    opened = locator.server_properties
    assert (opened["advertised_host"], opened["advertised_port"]) == (leader.host, str(port))
    overview = host_name_broker.http("GET", "/api/overview")[1]
    assert isinstance(overview, dict)
    assert overview["node"].split("@", 1)[1] == leader.host
    statuses = await send_confirmed(sender, "advertised", [b"via the balancer"])
    assert statuses[0].is_confirmed


async def test_a_configured_advertised_host_and_port(tmp_path: Path) -> None:
    settings = {"stream_advertised_host": "streams.example", "stream_advertised_port": 5999}
    with stream_broker_on(tmp_path / "configured", **settings) as running:
        locator = await Clients(running).start(
            Producer(HOST, stream_port(running), **CREDENTIALS)  # type: ignore[arg-type]
        )
        try:
            await locator.create_stream("configured")
            client = await locator.default_client
            leader, _ = await client.query_leader_and_replicas("configured")
            assert (leader.host, leader.port) == ("streams.example", 5999)
            assert client.server_properties is not None
            opened = client.server_properties
            assert (opened["advertised_host"], opened["advertised_port"]) == (
                "streams.example",
                "5999",
            )
        finally:
            await locator.close()


def test_node_stream_client_behind_an_address_resolver(
    host_name_broker: RunningBroker, node_client: Path
) -> None:
    port = str(stream_port(host_name_broker))
    result = run_node(node_client, "resolver", port, "node-resolver")
    assert result == {"stored": ["through the resolver"]}


# -- a small segment size -----------------------------------------------------------------


async def test_rstream_small_segment_size_is_accepted_and_rounded_up(
    broker: RunningBroker, clients: Clients
) -> None:
    sender = await clients.producer()
    await sender.create_stream("small", arguments={"stream-max-segment-size-bytes": 1000})
    body = b"x" * 200
    count = 4 * SEGMENT_BYTES_MIN // len(body)
    statuses = await send_confirmed(sender, "small", [body] * count)
    assert all(status.is_confirmed for status in statuses)
    received = await subscribe(await clients.consumer(), "small", OffsetType.FIRST)
    await received.wait(count)
    assert received.offsets() == list(range(count))
    segments = [p for p in broker.data_dir.rglob(f"*{SEGMENT_SUFFIX}") if "small" in str(p)]
    # Rounded up, not 1,000: each segment holds several 200-byte records; and rolled.
    assert 2 <= len(segments) <= 8, segments
    queue = broker.http("GET", "/api/queues/%2F/small")[1]
    assert isinstance(queue, dict)
    assert queue["arguments"]["x-stream-max-segment-size-bytes"] == 1000
