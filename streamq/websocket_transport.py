"""A WebSocket as an asyncio transport: one protocol session over binary messages.

Owns `WebSocketTransport`, an `asyncio.Transport` over a message socket (binary WebSocket
messages in and out, handed over by the HTTP gateway, which owns the upgrade and the
WebSocket framing), and `MessageSocket`, what the transport needs of that socket. The
AMQP and MQTT gateways each run their unchanged session over it (amqp_gateway/websocket.py,
mqtt_gateway/websocket.py): the session's parser takes a byte stream, so its frames or
packets may be split across messages or several share one. It must not parse any
protocol.

Limits: messages received wait in an inbox of INBOX_BYTES_MAX until the session's next
read; while it is full or the session paused reading, no further message is taken from
the socket (the WebSocket's own buffer fills, then TCP's: backpressure reaches the
client); outgoing bytes not yet written to the socket drive the session's
pause_writing/resume_writing, as a TCP transport's write buffer does. How large one
incoming message may be is the HTTP side's to enforce, from the gateway's setting.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Final, Protocol

logger = logging.getLogger(__name__)

# Write buffer marks as asyncio's TCP transports have them, until the session sets its own.
WRITE_BUFFER_HIGH_BYTES_DEFAULT: Final = 64 * 1024
# Messages received and not yet handed to the session: at most this much (plus the one
# message that crossed it) before receiving stops. A TCP read takes 1 MiB at most.
INBOX_BYTES_MAX: Final = 1024 * 1024


class MessageSocket(Protocol):
    """One upgraded WebSocket, as the HTTP gateway hands it over. `cross_origin`: its
    upgrade named an `Origin` (a browser page's) that is neither listed in the allowed
    origins nor the broker's own origin on a loopback host."""

    cross_origin: bool

    async def receive(self) -> bytes | None:
        """The next binary message; None once the socket is closed (by the peer, by an
        error the HTTP side has logged, or by `close`)."""

    async def send(self, data: bytes) -> None:
        """Send one binary message. Raises ConnectionError once the socket is gone."""

    async def close(self) -> None:
        """Close normally (1000), once what was sent is written."""

    def abort(self) -> None:
        """Drop the connection now, without a closing handshake."""

    def get_extra_info(self, name: str, default: object = None) -> object:
        """The underlying TCP (or TLS) transport's: peername, sockname, ssl_object..."""


class WebSocketTransport(asyncio.Transport):
    """The session's transport over a message socket; `run()` pumps it until it closes."""

    def __init__(
        self, socket: MessageSocket, protocol: asyncio.BufferedProtocol | asyncio.Protocol
    ) -> None:
        super().__init__()
        self._socket = socket
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()
        self._reading = True  # False while the session paused reading
        # Messages received, not yet handed over; the receiving stops while they hold
        # INBOX_BYTES_MAX or the session paused reading (`_room` clear).
        self._inbox: collections.deque[memoryview] = collections.deque()
        self._inbox_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._feed_scheduled = False
        self._closing = False
        self._lost = False
        self._pending: list[bytes] = []  # written by the session, not yet sent
        self._pending_bytes = 0
        self._write_wanted = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._high = WRITE_BUFFER_HIGH_BYTES_DEFAULT
        self._low = self._high // 4
        self._writing_paused = False

    async def run(self) -> None:
        """Start the session, receive messages until the socket closes, then tell the
        session the connection is lost."""
        self._writer = self._loop.create_task(self._write_loop())
        try:
            self._protocol.connection_made(self)
            while not self._closing:
                if not self._room.is_set():
                    await self._room.wait()
                    continue
                data = await self._socket.receive()
                if data is None:
                    break
                self._inbox.append(memoryview(data))
                self._inbox_bytes += len(data)
                if self._inbox_bytes >= INBOX_BYTES_MAX:
                    self._room.clear()
                self._schedule_feed()
            if self._closing:
                await asyncio.wait([self._writer])  # what the session wrote last, the close
            else:
                self._feed()  # what came before the close, as a TCP read before EOF
        finally:
            self._closing = self._lost = True
            self._writer.cancel()
            self._protocol.connection_lost(None)

    def _schedule_feed(self) -> None:
        if not self._feed_scheduled and self._reading:
            self._feed_scheduled = True
            self._loop.call_soon(self._feed)

    def _feed(self) -> None:
        """One read of the session: as much of the inbox as its buffer takes. It runs once
        per loop turn, as a TCP transport reads once per turn: messages that arrived
        meanwhile make one read (the session parses them as one, in publish runs), and
        the delivery drain and flow control run between two reads."""
        self._feed_scheduled = False
        inbox = self._inbox
        if not inbox or not self._reading or self._lost:
            return
        protocol = self._protocol
        try:
            if isinstance(protocol, asyncio.BufferedProtocol):
                self._feed_buffered(protocol)
            else:
                # A plain Protocol (MQTT's session) takes the inbox as one read.
                data = b"".join(inbox)
                inbox.clear()
                self._inbox_bytes = 0
                protocol.data_received(data)
        except Exception:  # as asyncio's transports: a protocol's bug ends its connection
            logger.exception("session over WebSocket failed; dropping the connection")
            self.abort()
            return
        if inbox:
            self._schedule_feed()
        if self._reading and self._inbox_bytes < INBOX_BYTES_MAX:
            self._room.set()

    def _feed_buffered(self, protocol: asyncio.BufferedProtocol) -> None:
        inbox = self._inbox
        buffer = memoryview(protocol.get_buffer(self._inbox_bytes))
        room, filled = len(buffer), 0
        while inbox and filled < room:
            data = inbox[0]
            count = min(room - filled, len(data))
            buffer[filled : filled + count] = data[:count]
            filled += count
            if count == len(data):
                inbox.popleft()
            else:
                inbox[0] = data[count:]
        self._inbox_bytes -= filled
        protocol.buffer_updated(filled)

    async def _write_loop(self) -> None:
        """Send what the session wrote, everything pending in one message; close the
        socket once the session closed the transport and all of it is sent."""
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        await self._socket.close()
                        return
                    self._write_wanted.clear()
                    await self._write_wanted.wait()
                    continue
                chunks, self._pending = self._pending, []
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                await self._socket.send(data)
                self._pending_bytes -= len(data)
                if self._writing_paused and self._pending_bytes <= self._low:
                    self._writing_paused = False
                    self._protocol.resume_writing()
        except ConnectionError as exc:
            logger.info("WebSocket client %s gone: %s", self._peer(), exc)
            self._drop()
        except Exception:  # the socket's bug: this connection only, as a session's
            logger.exception("writing to WebSocket client %s failed", self._peer())
            self._drop()

    def _peer(self) -> str:
        peer = self._socket.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    # -- asyncio.Transport -----------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return  # as a closed TCP transport, writes after close go nowhere
        self._pending.append(bytes(data))
        self._pending_bytes += len(data)
        self._write_wanted.set()
        if not self._writing_paused and self._pending_bytes > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._write_wanted.set()
            self._room.set()  # a waiting receiver stops; the writer sends and closes

    def abort(self) -> None:
        self._drop()

    def _drop(self) -> None:
        self._closing = True
        self._pending.clear()
        self._pending_bytes = 0
        self._inbox.clear()
        self._room.set()
        if self._writer is not None and self._writer is not asyncio.current_task():
            self._writer.cancel()
        self._socket.abort()

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        self._reading = False
        self._room.clear()

    def resume_reading(self) -> None:
        if self._reading or self._closing:
            return
        self._reading = True
        self._schedule_feed()
        if self._inbox_bytes < INBOX_BYTES_MAX:
            self._room.set()

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = WRITE_BUFFER_HIGH_BYTES_DEFAULT if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_size(self) -> int:
        return self._pending_bytes

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._socket.get_extra_info(name, default)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol
