"""The asyncio MQTT 3.1.1 client of `streamq perf mqtt`, on the project's codec.

Owns `PerfConnection`, one connection's asyncio Protocol: what it reads goes through
`mqtt_wire.Incoming` in bulk, PINGREQs are answered at once, a handler may act on every
read (a consumer's PUBACKs), and waiters are woken (`wake`) on every read and when the
connection ends. Also `open_connection` (CONNECT, CONNACK) and `subscribe` (SUBSCRIBE,
SUBACK). Every wait has a timeout; failures are `PerfError`s with a one-line reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from typing import Final, cast

from mqtt_gateway.codec import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from streamq.perf.errors import PerfError
from streamq.perf.mqtt_options import MqttUri
from streamq.perf.mqtt_wire import LEVEL, Incoming

IO_TIMEOUT_S: Final = 30.0
"""How long a CONNACK, SUBACK or a connection may take."""
WRITE_BUFFER_HIGH_BYTES: Final = 1 << 20
"""Writers wait (`writable`) while more than this is queued for the socket."""
SUBACK_FAILURE: Final = 0x80
PINGREQ: Final = encode(PingReq(), LEVEL)
PINGRESP: Final = encode(PingResp(), LEVEL)
DISCONNECT: Final = encode(Disconnect(), LEVEL)


class PerfConnection(asyncio.Protocol):
    """One MQTT connection of the load generator."""

    def __init__(self, expected_body: bytes | None = None) -> None:
        self.incoming = Incoming(expected_body)
        self.transport: asyncio.Transport | None = None
        self.wake = asyncio.Event()  # set on every read and at the end
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed = False
        self.error: PerfError | None = None
        self.on_read: Callable[[PerfConnection], None] | None = None
        self.publishes_max = -1  # deliveries a read may count (a consumer's -R); -1: all
        self._control: asyncio.Queue[Packet] = asyncio.Queue()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)

    def data_received(self, data: bytes) -> None:
        incoming = self.incoming
        try:
            incoming.feed(data, self.publishes_max)
        except PerfError as exc:
            self.fail(exc)
            return
        if incoming.pingreqs:
            self.write(PINGRESP * incoming.pingreqs)
            incoming.pingreqs = 0
        if incoming.others:
            for packet in incoming.others:
                self._control.put_nowait(packet)
            incoming.others.clear()
        if self.on_read is not None:
            self.on_read(self)
        self.wake.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.wake.set()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def write(self, data: bytes | bytearray) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def fail(self, error: PerfError) -> None:
        """Note the first error and close; waiters see `closed` and `error`."""
        if self.error is None:
            self.error = error
        self.close()

    def check(self, what: str) -> None:
        """Raises `PerfError` once the connection has failed or the broker closed it."""
        if self.error is not None:
            raise self.error
        if self.closed:
            raise PerfError(f"{what}: the broker closed the connection")

    async def next_control(self, what: str) -> Packet:
        """The next packet other than PUBLISH, PUBACK and pings. Raises `PerfError`
        after IO_TIMEOUT_S or when the connection ends first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + IO_TIMEOUT_S
        while self._control.empty():
            self.check(what)
            if loop.time() > deadline:
                raise PerfError(f"{what}: no answer in {IO_TIMEOUT_S:.0f} s")
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), deadline - loop.time())
        return self._control.get_nowait()

    def close(self, *, graceful: bool = False) -> None:
        """Close (after a DISCONNECT when `graceful`)."""
        if self.transport is not None and not self.transport.is_closing():
            if graceful and not self.closed:
                self.transport.write(DISCONNECT)
            self.transport.close()


def tls_context(uri: MqttUri) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=uri.cacertfile or None)
    if not uri.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def open_connection(
    uri: MqttUri,
    client_id: str,
    *,
    clean_session: bool,
    keepalive_s: int = 0,
    expected_body: bytes | None = None,
) -> PerfConnection:
    """Connect and log in. Raises `PerfError` when the connection or login fails."""
    loop = asyncio.get_running_loop()
    address = f"{uri.host}:{uri.port}"
    try:
        _transport, connection = await asyncio.wait_for(
            loop.create_connection(
                lambda: PerfConnection(expected_body),
                uri.host,
                uri.port,
                ssl=tls_context(uri) if uri.tls else None,
            ),
            IO_TIMEOUT_S,
        )
    except TimeoutError:
        raise PerfError(f"cannot connect to {address}: timed out") from None
    except (OSError, ssl.SSLError) as exc:
        raise PerfError(f"cannot connect to {address}: {exc.strerror or exc}") from None
    connect = Connect(
        LEVEL, client_id, clean_session, keepalive_s, uri.username, uri.password.encode()
    )
    connection.write(encode(connect, LEVEL))
    try:
        answer = await connection.next_control(f"{client_id} CONNECT")
        if not isinstance(answer, ConnAck):
            raise PerfError(f"{client_id}: expected CONNACK, got {type(answer).__name__}")
        if answer.reason_code != 0:
            raise PerfError(f"{client_id}: login refused, CONNACK {answer.reason_code}")
    except PerfError:
        connection.close()
        raise
    return connection


async def subscribe(connection: PerfConnection, topic: str, qos: int) -> None:
    """Subscribe with packet identifier 1. Raises `PerfError` when refused."""
    connection.write(encode(Subscribe(1, (Subscription(topic, qos),)), LEVEL))
    answer = await connection.next_control(f"SUBSCRIBE {topic!r}")
    if not isinstance(answer, SubAck):
        raise PerfError(f"SUBSCRIBE {topic!r}: expected SUBACK, got {type(answer).__name__}")
    if answer.reason_codes[0] >= SUBACK_FAILURE:
        raise PerfError(f"SUBSCRIBE {topic!r}: refused ({answer.reason_codes[0]:#x})")
