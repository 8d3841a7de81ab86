"""aio-pika (asyncio) against the broker, and protocol-level behaviour a raw socket shows:
heartbeat timeout of a silent client and graceful shutdown."""

from __future__ import annotations

import socket
import time

import aio_pika
import pytest

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10


async def test_aio_pika_round_trip_with_confirms(broker: RunningBroker) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
    connection = await aio_pika.connect(url, timeout=TIMEOUT_S)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=10)
        exchange = await channel.declare_exchange("events", aio_pika.ExchangeType.DIRECT)
        queue = await channel.declare_queue("aio", durable=True)
        await queue.bind(exchange, "created")
        for i in range(100):
            await exchange.publish(
                aio_pika.Message(str(i).encode(), headers={"n": i}), routing_key="created"
            )
        received = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    received.append((message.body, message.headers["n"]))
                if len(received) == 100:
                    break
        assert received == [(str(i).encode(), i) for i in range(100)]
        declared = await channel.declare_queue("aio", passive=True)
        assert declared.declaration_result.message_count == 0


def read_frames(sock: socket.socket, deadline: float) -> list[codec.Frame]:
    data = b""
    frames: list[codec.Frame] = []
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
        got, used = codec.split_frames(data, 131072)
        data = data[used:]
        frames += got
    return frames


def handshake(port: int, heartbeat_s: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=1)
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    sock.recv(65536)  # connection.start
    start_ok = m.ConnectionStartOk(mechanism="PLAIN", response=b"\x00guest\x00guest")
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), start_ok))
    sock.recv(65536)  # connection.tune
    tune_ok = m.ConnectionTuneOk(channel_max=2047, frame_max=131072, heartbeat=heartbeat_s)
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), tune_ok))
    sock.sendall(codec.encode_method_frame(codec.ChannelId(0), m.ConnectionOpen("/")))
    return sock


@pytest.mark.timeout(30)
def test_a_silent_client_is_dropped_after_two_heartbeat_intervals(broker: RunningBroker) -> None:
    sock = handshake(broker.amqp_port, heartbeat_s=1)
    start = time.monotonic()
    frames = read_frames(sock, start + 15)
    elapsed = time.monotonic() - start
    sock.close()
    heartbeats = [f for f in frames if f.frame_type == codec.FRAME_HEARTBEAT]
    assert heartbeats, "the server sends heartbeats while the client is quiet"
    assert 2.0 <= elapsed < 6.0, f"dropped after {elapsed:.1f} s"


def test_shutdown_closes_clients_with_320(tmp_path: object, broker: RunningBroker) -> None:
    sock = handshake(broker.amqp_port, heartbeat_s=0)
    read_frames(sock, time.monotonic() + 0.3)  # open-ok
    broker.stop()
    frames = read_frames(sock, time.monotonic() + 5)
    sock.close()
    closes = [codec.decode_method(f.payload) for f in frames if f.frame_type == 1]
    assert any(isinstance(c, m.ConnectionClose) and c.reply_code == 320 for c in closes)


@pytest.mark.timeout(30)
def test_a_client_that_never_completes_the_handshake_is_dropped(broker: RunningBroker) -> None:
    sock = socket.create_connection(("127.0.0.1", broker.amqp_port), timeout=1)
    sock.sendall(b"AMQP\x00\x00\x09\x01")  # and then nothing
    start = time.monotonic()
    read_frames(sock, start + 20)  # returns when the server closes the socket
    elapsed = time.monotonic() - start
    sock.close()
    assert 9.0 <= elapsed < 13.0, f"dropped after {elapsed:.1f} s"
