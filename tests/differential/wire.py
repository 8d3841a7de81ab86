"""A raw AMQP 0-9-1 client for the differential tests, built on the project's codec.

It sends exactly the frames a scenario asks for, in order, and turns every frame the
broker sends back into an `Observation`: plain tuples and dicts that compare equal when
two brokers said the same thing. It answers `channel.close` and `connection.close` with
their close-ok, as every client does, and records both.

It blocks on one socket with a deadline on every read: a broker that stays silent ends a
read with `Silence`, never a hang.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, fields
from typing import Any

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import AMQPError

READ_TIMEOUT_S = 5.0
RECEIVE_BYTES_MAX = 1 << 20
# What a client announces: RabbitMQ sends basic.cancel and connection.blocked only to
# clients that ask for them, so every scenario runs with the capabilities pika announces.
CLIENT_PROPERTIES: dict[str, object] = {
    "product": "streamq-differential",
    "capabilities": {
        "publisher_confirms": True,
        "exchange_exchange_bindings": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    },
}
_ENVELOPE = struct.Struct(">BHI")

Observation = tuple[Any, ...]


class Silence(Exception):
    """The broker sent nothing before the deadline."""


class Closed(Exception):
    """The broker closed the socket."""


def method_fields(method: codec.Method) -> dict[str, object]:
    return {f.name: getattr(method, f.name) for f in fields(method)}  # type: ignore[arg-type]


def properties_fields(raw: bytes) -> dict[str, object]:
    decoded = codec.decode_properties(raw)
    values = {f.name: getattr(decoded, f.name) for f in fields(decoded)}
    return {name: value for name, value in values.items() if value is not None}


@dataclass
class Content:
    """A content-carrying method being assembled from its header and body frames."""

    channel: int
    method: codec.Method
    body_size: int = -1
    properties_raw: bytes = b""
    body: bytes = b""


class WireClient:
    """One AMQP connection over a blocking socket."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=READ_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
        self.frame_max = codec.FRAME_MIN_SIZE
        self.channel_max = 0
        self.closed = False  # connection.close seen or socket gone
        self.closing: set[int] = set()  # channels we asked to close
        self._content: dict[int, Content] = {}

    # Sending.
    def send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def send(self, channel: int, method: codec.Method) -> None:
        self.send_raw(codec.encode_method_frame(codec.ChannelId(channel), method))

    def send_content(
        self,
        channel: int,
        method: codec.Method,
        body: bytes,
        properties: codec.BasicProperties | None = None,
        frame_max: int | None = None,
    ) -> None:
        """A content-carrying method with its header and body frames cut at `frame_max`
        (the negotiated one unless given)."""
        out = bytearray()
        raw = codec.encode_properties(properties or codec.BasicProperties())
        codec.append_method_frame(out, codec.ChannelId(channel), method)
        codec.append_content_header_frame(out, codec.ChannelId(channel), len(body), raw, 1 << 20)
        codec.append_body_frames(out, codec.ChannelId(channel), body, frame_max or self.frame_max)
        self.send_raw(bytes(out))

    # Receiving.
    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Silence()
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(RECEIVE_BYTES_MAX)
        except TimeoutError:
            raise Silence() from None
        except OSError:
            data = b""
        if not data:
            self.closed = True
            raise Closed()
        self.buffer += data

    def read_frame(self, deadline: float) -> tuple[int, int, bytes]:
        while True:
            if len(self.buffer) >= 7:
                frame_type, channel, size = _ENVELOPE.unpack_from(self.buffer)
                end = 7 + size
                if len(self.buffer) > end:
                    payload = bytes(self.buffer[7:end])
                    assert self.buffer[end] == codec.FRAME_END, "broker sent a bad frame end"
                    del self.buffer[: end + 1]
                    return frame_type, channel, payload
            self._fill(deadline)

    def read(self, timeout_s: float = READ_TIMEOUT_S) -> Observation:
        """The next observation: a method, or a content method with its properties and
        body. Answers closes with close-ok. Raises `Silence` or `Closed`."""
        deadline = time.monotonic() + timeout_s
        while True:
            frame_type, channel, payload = self.read_frame(deadline)
            if frame_type == codec.FRAME_HEARTBEAT:
                continue
            if frame_type == codec.FRAME_METHOD:
                try:
                    method = codec.decode_method(payload)
                except AMQPError:
                    # Our decoder reads the server's strings as UTF-8; a reply text that
                    # carries a peer's raw octets (RabbitMQ quotes frame payloads) is not.
                    # Compare such a frame by its bytes, and answer it if it is a close.
                    self._after_undecodable(channel, payload)
                    return ("undecodable method", channel, payload)
                if method.CONTENT:
                    self._content[channel] = Content(channel, method)
                    continue
                self._after(channel, method)
                return ("method", channel, method.NAME, method_fields(method))
            content = self._content.get(channel)
            assert content is not None, f"frame type {frame_type} without a content method"
            if frame_type == codec.FRAME_HEADER:
                header = codec.decode_content_header(payload)
                content.body_size, content.properties_raw = header.body_size, header.properties_raw
            else:
                content.body += payload
            if content.body_size == len(content.body):
                del self._content[channel]
                return (
                    "content",
                    channel,
                    content.method.NAME,
                    method_fields(content.method),
                    properties_fields(content.properties_raw),
                    content.body,
                )

    def _after_undecodable(self, channel: int, payload: bytes) -> None:
        ids = struct.unpack_from(">HH", payload)
        if ids == (m.ConnectionClose.CLASS_ID, m.ConnectionClose.METHOD_ID):
            self._after(0, m.ConnectionClose())
        elif ids == (m.ChannelClose.CLASS_ID, m.ChannelClose.METHOD_ID):
            self._after(channel, m.ChannelClose())

    def _after(self, channel: int, method: codec.Method) -> None:
        if isinstance(method, m.ChannelClose):
            self.send(channel, m.ChannelCloseOk())
        elif isinstance(method, m.ChannelCloseOk):
            self.closing.discard(channel)
        elif isinstance(method, m.ConnectionClose):
            self.send(0, m.ConnectionCloseOk())
            self.closed = True
        elif isinstance(method, m.ConnectionCloseOk):
            self.closed = True

    # The handshake.
    def handshake(
        self,
        *,
        vhost: str = "/",
        user: str = "guest",
        password: str = "guest",
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat: int = 0,
        client_properties: dict[str, object] | None = None,
    ) -> list[Observation]:
        """Protocol header to open-ok; the observations after connection.start (whose
        server properties differ between brokers by design)."""
        self.send_raw(codec.PROTOCOL_HEADER_0_9_1)
        start = self.read()
        assert start[2] == "connection.start", start
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        self.send(
            0,
            m.ConnectionStartOk(
                client_properties=(  # type: ignore[arg-type]
                    CLIENT_PROPERTIES if client_properties is None else client_properties
                ),
                mechanism="PLAIN",
                response=response,
            ),
        )
        tune = self.read()
        if tune[2] != "connection.tune":
            return [tune]
        offered = tune[3]
        self.channel_max = offered["channel_max"] if channel_max is None else channel_max
        self.frame_max = offered["frame_max"] if frame_max is None else frame_max
        self.send(
            0,
            m.ConnectionTuneOk(
                channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=heartbeat
            ),
        )
        self.send(0, m.ConnectionOpen(virtual_host=vhost))
        return [self.read()]

    def close(self) -> None:
        self.sock.close()
