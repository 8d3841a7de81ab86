"""Connection tuning from the broker's configuration (ServeConfig heartbeat_s, frame_max,
channel_max, max_message_size): pika negotiates the configured values, the management
API shows them, a message above max_message_size gets the error the default limit gives,
and a value out of range stops the broker from starting with a message naming it."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TypeVar

import pika
import pika.exceptions
import pytest

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from streamq.app import ServeError
from tests.integration.conftest import RunningBroker

TIMEOUT_S = 10
M = TypeVar("M", bound=m.Method)


def test_pika_negotiates_the_configured_tuning(tmp_path: Path) -> None:
    broker = RunningBroker(
        tmp_path / "data", heartbeat_s=7, frame_max=8192, channel_max=5, max_message_size=1000
    )
    try:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", broker.amqp_port, socket_timeout=TIMEOUT_S)
        )
        try:
            params = connection._impl.params  # what pika settled on after connection.tune
            assert (params.heartbeat, params.frame_max, params.channel_max) == (7, 8192, 5)
            channels = [connection.channel() for _ in range(5)]  # channel_max of them
            status, listed, _ = broker.http("GET", "/api/connections")
            assert status == 200 and isinstance(listed, list)
            [shown] = listed
            assert (shown["timeout"], shown["frame_max"], shown["channel_max"]) == (7, 8192, 5)
            channel = channels[0]
            channel.confirm_delivery()
            channel.queue_declare("q")
            # A body longer than frame_max goes in several body frames; 1000 bytes is
            # the limit and passes.
            channel.basic_publish("", "q", b"x" * 1000)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                channel.basic_publish("", "q", b"x" * 1001)
            assert closed.value.reply_code == 406
            assert closed.value.reply_text == (
                "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000"
            )
            assert channels[1].queue_declare("q", passive=True).method.message_count == 1
        finally:
            connection.close()
    finally:
        broker.stop()


def test_frames_up_to_a_larger_frame_max_pass(tmp_path: Path) -> None:
    """A frame_max above the default (pika refuses one, so a raw client): the broker
    offers it, and a message in one body frame of nearly that size is stored and read
    back whole (the gateway's shared read buffer grows with frame_max)."""
    frame_max = 1024 * 1024
    broker = RunningBroker(tmp_path / "data", frame_max=frame_max)
    try:
        with socket.create_connection(("127.0.0.1", broker.amqp_port), TIMEOUT_S) as sock:
            reader = Reader(sock, frame_max)
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            reader.until(m.ConnectionStart)
            start_ok = m.ConnectionStartOk(mechanism="PLAIN", response=b"\x00guest\x00guest")
            send(sock, 0, start_ok)
            tune = reader.until(m.ConnectionTune)
            assert tune.frame_max == frame_max
            send(sock, 0, m.ConnectionTuneOk(channel_max=1, frame_max=frame_max, heartbeat=0))
            send(sock, 0, m.ConnectionOpen("/"))
            reader.until(m.ConnectionOpenOk)
            send(sock, 1, m.ChannelOpen())
            reader.until(m.ChannelOpenOk)
            send(sock, 1, m.QueueDeclare(queue="big"))
            reader.until(m.QueueDeclareOk)
            body = bytes(range(256)) * ((frame_max - 8) // 256)  # one body frame
            out = bytearray()
            properties = codec.encode_properties(codec.BasicProperties())
            publish = m.BasicPublish(exchange="", routing_key="big")
            codec.append_content_frames(
                out, codec.ChannelId(1), publish, properties, body, frame_max
            )
            sock.sendall(out)
            send(sock, 1, m.BasicGet(queue="big", no_ack=True))
            reader.until(m.BasicGetOk)
            assert reader.body_until(len(body)) == body
    finally:
        broker.stop()


def send(sock: socket.socket, channel: int, method: m.Method) -> None:
    sock.sendall(codec.encode_method_frame(codec.ChannelId(channel), method))


class Reader:
    """Methods and body bytes a raw connection receives."""

    def __init__(self, sock: socket.socket, frame_max: int) -> None:
        self.sock = sock
        self.frame_max = frame_max
        self.data = b""
        self.methods: list[m.Method] = []
        self.body = bytearray()

    def _read(self) -> None:
        chunk = self.sock.recv(1 << 20)
        assert chunk, "the broker closed the socket"
        self.data += chunk
        frames, used = codec.split_frames(self.data, self.frame_max)
        self.data = self.data[used:]
        for frame in frames:
            if frame.frame_type == codec.FrameType.METHOD:
                self.methods.append(codec.decode_method(frame.payload))
            elif frame.frame_type == codec.FrameType.BODY:
                self.body += frame.payload

    def until(self, kind: type[M]) -> M:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for method in self.methods:
                if isinstance(method, kind):
                    self.methods.remove(method)
                    return method
            assert time.monotonic() < deadline, f"no {kind.__name__}; got {self.methods}"
            self._read()

    def body_until(self, size: int) -> bytes:
        deadline = time.monotonic() + TIMEOUT_S
        while len(self.body) < size:
            assert time.monotonic() < deadline, f"{len(self.body)} of {size} body bytes"
            self._read()
        return bytes(self.body)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"frame_max": 4095}, "frame_max must be between 4096 and 16777216, not 4095"),
        ({"channel_max": 0}, "channel_max must be between 1 and 65535, not 0"),
        ({"heartbeat_s": 70000}, "heartbeat must be between 0 and 65535, not 70000"),
        ({"max_message_size": 0}, "max_message_size must be between 1 and 536870912, not 0"),
    ],
)
def test_a_value_out_of_range_stops_the_start(
    tmp_path: Path, setting: dict[str, int], message: str
) -> None:
    with pytest.raises(ServeError, match=message):
        RunningBroker(tmp_path / "data", **setting)
