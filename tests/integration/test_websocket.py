"""AMQP over WebSocket on the HTTP port (http_gateway/websocket_api.py, amqp_gateway/
websocket.py). Two methods: pika runs unchanged through a loopback TCP-to-WebSocket relay
(ws_relay.py) for the AMQP features (confirms, consumers, alarms, heartbeats, flow); a raw
client (aiohttp's WebSocket client, frames from pamqp: ws_amqp.py) sends frames in exact
messages for the WebSocket rules (split and packed frames, text, size, subprotocols, a
client that vanishes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pika
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel

from streamq.broker import vhost_delivery as vhost_module
from streamq.broker.resources import ResourceLimits
from tests.integration.conftest import RunningBroker
from tests.integration.ws_amqp import RawAmqp, method, publish
from tests.integration.ws_relay import WebSocketRelay

TIMEOUT_S = 10
TERABYTE = 1 << 40


@pytest.fixture
def relay(broker: RunningBroker) -> Iterator[WebSocketRelay]:
    started = WebSocketRelay(f"ws://127.0.0.1:{broker.http_port}/")
    yield started
    started.close()


def ws_url(broker: RunningBroker, path: str = "/") -> str:
    return f"ws://127.0.0.1:{broker.http_port}{path}"


def connect(port: int, **params: object) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, blocked_connection_timeout=60, **params)
    )


def wait_until(predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def connections(broker: RunningBroker) -> list[dict[str, object]]:
    status, body, _ = broker.http("GET", "/api/connections")
    assert status == 200 and isinstance(body, list)
    return body


def queue_messages(broker: RunningBroker, name: str) -> int:
    status, body, _ = broker.http("GET", f"/api/queues/%2F/{name}")
    assert status == 200 and isinstance(body, dict)
    return int(body["messages"])


# -- pika through the relay ----------------------------------------------------------------


def test_confirms_and_acked_consumers_over_websocket(
    broker: RunningBroker, relay: WebSocketRelay
) -> None:
    connection = connect(relay.port)
    channel = connection.channel()
    channel.queue_declare("ws", durable=True)
    channel.confirm_delivery()  # each publish below waits for its confirm
    for n in range(100):
        channel.basic_publish("", "ws", f"m{n}".encode(), pika.BasicProperties(delivery_mode=2))
    assert queue_messages(broker, "ws") == 100
    got: list[bytes] = []
    channel.basic_qos(prefetch_count=10)
    for delivered, _, body in channel.consume("ws", inactivity_timeout=TIMEOUT_S):
        assert delivered is not None, "deliveries stopped"
        got.append(body)
        channel.basic_ack(delivered.delivery_tag)
        if len(got) == 100:
            break
    channel.cancel()
    assert got == [f"m{n}".encode() for n in range(100)]
    # Listed as any connection: the peer is the WebSocket client (the relay), on the
    # HTTP port; the session's counters include the WebSocket's AMQP bytes.
    (listed,) = connections(broker)
    assert listed["protocol"] == "AMQP 0-9-1"
    assert listed["port"] == broker.http_port
    assert listed["peer_host"] == "127.0.0.1"
    assert isinstance(listed["recv_oct"], int) and listed["recv_oct"] > 100 * 8
    connection.close()
    wait_until(lambda: not connections(broker))
    assert queue_messages(broker, "ws") == 0


@pytest.fixture
def alarmed_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A memory limit of 1 byte: the resource alarm is on from the first check."""
    running = RunningBroker(tmp_path / "data", ResourceLimits(1, 0))
    yield running
    running.stop()


def _clear_alarm(broker: RunningBroker) -> None:
    def clear() -> None:
        assert broker.broker is not None
        broker.broker.resources.limits = ResourceLimits(TERABYTE, 0)

    broker.call(clear)


def test_a_publisher_is_blocked_under_an_alarm_and_unblocked(
    alarmed_broker: RunningBroker,
) -> None:
    relay = WebSocketRelay(ws_url(alarmed_broker))
    try:
        connection = connect(relay.port)
        blocked: list[object] = []
        unblocked: list[object] = []
        connection.add_on_connection_blocked_callback(lambda _c, frame: blocked.append(frame))
        connection.add_on_connection_unblocked_callback(lambda _c, frame: unblocked.append(frame))
        channel = connection.channel()
        channel.queue_declare("alarmed")
        channel.basic_publish("", "alarmed", b"first")
        wait_until(lambda: bool(connection.process_data_events(0.05) or blocked))
        assert blocked[0].method.reason == "low on memory"  # type: ignore[attr-defined]
        channel.basic_publish("", "alarmed", b"second")  # sent, not read while blocked
        connection.process_data_events(time_limit=0.3)
        assert queue_messages(alarmed_broker, "alarmed") == 1
        _clear_alarm(alarmed_broker)
        wait_until(lambda: bool(connection.process_data_events(0.05) or unblocked))
        wait_until(lambda: queue_messages(alarmed_broker, "alarmed") == 2)
        connection.close()
    finally:
        relay.close()


def test_heartbeats_keep_an_idle_connection_open(
    broker: RunningBroker, relay: WebSocketRelay
) -> None:
    connection = connect(relay.port, heartbeat=1)
    channel = connection.channel()
    channel.queue_declare("idle")
    connection.sleep(3.5)  # idle, but for heartbeats, for more than 2 intervals
    assert connection.is_open
    channel.basic_publish("", "idle", b"still here")
    wait_until(lambda: queue_messages(broker, "idle") == 1)
    (listed,) = connections(broker)
    assert listed["timeout"] == 1
    connection.close()


def test_publisher_flow_holds_a_websocket_publisher(
    broker: RunningBroker, relay: WebSocketRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The goal: a queue in flow pauses the WebSocket session's reading as it pauses a TCP
    socket's. Method: the flow marks lowered (as tests/integration/test_flow.py does), a
    slow consumer over TCP, a fast publisher through the relay; the backlog stays near
    the high mark and every message arrives in order."""
    high, count, body_bytes = 300, 10_000, 1024
    monkeypatch.setattr(vhost_module, "FLOW_READY_HIGH", high)
    monkeypatch.setattr(vhost_module, "FLOW_READY_LOW", high // 2)
    setup = connect(broker.amqp_port)
    setup.channel().queue_declare("flow")
    setup.close()
    received: list[int] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            connection = connect(broker.amqp_port)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=20)

            def on_message(ch: BlockingChannel, deliver: object, _p: object, body: bytes) -> None:
                received.append(int.from_bytes(body[:4], "big"))
                if len(received) % 10 == 0:
                    time.sleep(0.002)  # slower than the publisher
                ch.basic_ack(deliver.delivery_tag)  # type: ignore[attr-defined]
                if len(received) == count:
                    ch.stop_consuming()

            channel.basic_consume("flow", on_message)
            channel.start_consuming()
            connection.close()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    publisher = connect(relay.port)
    publisher_channel = publisher.channel()
    peak, flowed = 0, False

    def state() -> tuple[int, bool]:
        assert broker.broker is not None
        queue = broker.broker.vhosts["/"].queues["flow"]
        return queue.cursor.message_count, queue.in_flow

    for n in range(count):
        publisher_channel.basic_publish("", "flow", n.to_bytes(4, "big") * (body_bytes // 4))
        if n % 100 == 0:
            ready, in_flow = broker.ask(state)
            peak, flowed = max(peak, ready), flowed or in_flow
    deadline = time.monotonic() + 60
    while consumer.is_alive() and time.monotonic() < deadline:
        ready, in_flow = broker.ask(state)
        peak, flowed = max(peak, ready), flowed or in_flow
        publisher.process_data_events(time_limit=0.01)
    consumer.join(1)
    assert not errors
    assert received == list(range(count))
    assert flowed
    # As over TCP (test_flow.py): the read that crosses the mark is not held, the next
    # one is; a read takes 1 MiB at most (the messages that arrived since the last one).
    assert peak < high + 2 * (1024 * 1024 // body_bytes)
    publisher.close()


def test_broker_shutdown_closes_websocket_clients_with_320(tmp_path: Path) -> None:
    running = RunningBroker(tmp_path / "data")
    relay = WebSocketRelay(ws_url(running))
    try:
        connection = connect(relay.port)
        connection.channel()
        started = time.monotonic()
        running.stop()
        assert time.monotonic() - started < 5
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.process_data_events(time_limit=TIMEOUT_S)
        assert closed.value.reply_code == 320
    finally:
        relay.close()
        running.stop()


# -- raw frames over aiohttp's WebSocket client --------------------------------------------


async def test_frames_split_across_messages_and_packed_in_one(broker: RunningBroker) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url(broker)) as ws:
        amqp = RawAmqp(ws)
        await amqp.handshake(split=True)  # one byte per message
        # Several frames in one message: open, confirm mode, declare, three publishes.
        packed = (
            method(commands.Channel.Open(), 1)
            + method(commands.Confirm.Select(), 1)
            + method(commands.Queue.Declare(queue="raw"), 1)
            + b"".join(publish(1, "raw", f"packed {n}".encode()) for n in range(3))
        )
        await amqp.send(packed)
        await amqp.expect(commands.Channel.OpenOk)
        await amqp.expect(commands.Confirm.SelectOk)
        await amqp.expect(commands.Queue.DeclareOk)
        acked = 0
        while acked < 3:
            ack = await amqp.expect(commands.Basic.Ack)
            acked = ack.delivery_tag  # type: ignore[attr-defined]
        # A publish split across messages of 5 bytes, frame boundaries ignored.
        split = publish(1, "raw", b"split" * 100)
        for start in range(0, len(split), 5):
            await amqp.send(split[start : start + 5])
        ack = await amqp.expect(commands.Basic.Ack)
        assert ack.delivery_tag == 4  # type: ignore[attr-defined]
        await amqp.send(method(commands.Basic.Get(queue="raw", no_ack=True), 1))
        await amqp.expect(commands.Basic.GetOk)
    assert queue_messages(broker, "raw") == 3


async def test_subprotocols_and_paths(broker: RunningBroker) -> None:
    async with aiohttp.ClientSession() as session:
        # Offered among others: chosen and named in the reply, on any path.
        async with session.ws_connect(
            ws_url(broker, "/any/path"), protocols=("mqtt", "amqp")
        ) as ws:
            assert ws.protocol == "amqp"
            await RawAmqp(ws).handshake()
        # None offered (LavinMQ's JavaScript client): accepted, no subprotocol named.
        async with session.ws_connect(ws_url(broker, "/api/overview")) as ws:
            assert ws.protocol is None
            await RawAmqp(ws).handshake()
        # Other subprotocols only: refused, not an AMQP connection.
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(ws_url(broker), protocols=("stomp",))
        assert refused.value.status == 400
    # Plain requests still reach the API and its authentication.
    assert broker.http("GET", "/api/overview")[0] == 200
    assert broker.http("GET", "/api/overview", password="wrong")[0] == 401


async def test_a_text_message_closes_the_socket(broker: RunningBroker) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url(broker)) as ws:
        await RawAmqp(ws).handshake()
        await ws.send_str("AMQP frames go in binary messages")
        msg = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
        assert msg.type is aiohttp.WSMsgType.CLOSE
        assert ws.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA
    wait_until(lambda: not connections(broker))


@pytest.fixture
def small_broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """max_message_size 64 KiB: a WebSocket message may carry about 320 KiB (one such
    publish with its frames, amqp_gateway/websocket.py message_bytes_max)."""
    running = RunningBroker(tmp_path / "data", max_message_size=64 * 1024)
    yield running
    running.stop()


async def test_an_oversized_message_closes_the_socket(small_broker: RunningBroker) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(ws_url(small_broker)) as ws:
            amqp = RawAmqp(ws)
            await amqp.handshake()
            await ws.send_bytes(b"\x01" * (1024 * 1024))
            msg = await asyncio.wait_for(ws.receive(), TIMEOUT_S)
            assert msg.type is aiohttp.WSMsgType.CLOSE
            assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        # The broker goes on.
        async with session.ws_connect(ws_url(small_broker)) as ws:
            await RawAmqp(ws).handshake()
    wait_until(lambda: not connections(small_broker))


async def test_missed_heartbeats_close_a_silent_client(broker: RunningBroker) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url(broker)) as ws:
        amqp = RawAmqp(ws)
        await amqp.handshake(heartbeat_s=1)
        started = time.monotonic()
        with pytest.raises(ConnectionError, match="socket closed"):
            while True:  # heartbeats from the broker, then the socket closes
                await amqp.next_frame()
        assert time.monotonic() - started < 5  # two intervals, and a check
    wait_until(lambda: not connections(broker))


async def test_alarm_backpressure_reaches_the_client(alarmed_broker: RunningBroker) -> None:
    """The goal: a blocked session stops taking WebSocket messages, and the client's own
    sends stall (TCP backpressure) rather than the broker buffering what it sends.
    Method: 64 MiB of publishes (more than loopback TCP buffers hold) sent while the
    alarm is on; the session has taken little of it and the send has not finished; once
    the alarm clears, every publish arrives."""
    count, payload = 1024, b"x" * (64 * 1024)
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(alarmed_broker)) as ws,
    ):
        amqp = RawAmqp(ws)
        await amqp.handshake()
        await amqp.send(
            method(commands.Channel.Open(), 1) + method(commands.Queue.Declare(queue="bp"), 1)
        )
        await amqp.expect(commands.Channel.OpenOk)
        await amqp.expect(commands.Queue.DeclareOk)
        await amqp.send(publish(1, "bp", b"first"))  # read, then the connection is blocked
        await amqp.expect(commands.Connection.Blocked)
        one = publish(1, "bp", payload)

        async def send_all() -> None:
            for _ in range(count):
                await ws.send_bytes(one)

        sending = asyncio.ensure_future(send_all())
        done, _ = await asyncio.wait([sending], timeout=2)
        assert not done, "64 MiB went through a blocked connection"
        (listed,) = await asyncio.to_thread(connections, alarmed_broker)
        assert isinstance(listed["recv_oct"], int) and listed["recv_oct"] < 4 * 1024 * 1024
        assert listed["state"] == "blocked"
        _clear_alarm(alarmed_broker)
        await asyncio.wait_for(sending, 60)
        deadline = time.monotonic() + 60
        while await asyncio.to_thread(queue_messages, alarmed_broker, "bp") < count + 1:
            assert time.monotonic() < deadline, "publishes lost after the alarm cleared"
            await asyncio.sleep(0.05)


VANISHING_CLIENT = """
import asyncio, sys
import aiohttp
from tests.integration.ws_amqp import RawAmqp, publish

async def main() -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(sys.argv[1]) as ws:
        amqp = RawAmqp(ws)
        await amqp.handshake()
        from pamqp import commands
        from tests.integration.ws_amqp import method
        await amqp.send(method(commands.Channel.Open(), 1))
        await amqp.expect(commands.Channel.OpenOk)
        half = publish(1, "nowhere", b"y" * 1000)
        await amqp.send(half[: len(half) // 2])  # mid-frame
        print("ready", flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


def test_a_vanished_client_is_cleaned_up(broker: RunningBroker) -> None:
    root = Path(__file__).parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", VANISHING_CLIENT, ws_url(broker)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        assert len(connections(broker)) == 1
        os.kill(child.pid, signal.SIGKILL)  # gone mid-frame, no closing handshake
        child.wait(TIMEOUT_S)
        wait_until(lambda: not connections(broker))
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(TIMEOUT_S)
