"""The outbound AMQP 0-9-1 connection of shovels and federation links.

Owns `Connection`, an asyncio BufferedProtocol (uvloop in the broker): the client's side
of the handshake (PLAIN or EXTERNAL, tune as RabbitMQ's Erlang client negotiates it),
one receive buffer parsed whole per read by `wire.scan`, one output buffer written once
per event-loop turn (or sooner when it holds FLUSH_BYTES), heartbeats sent and watched,
connection.blocked, and the one path by which a connection ends (`_fail`): `closed`
then carries an `AmqpConnectionError` saying why, and every channel ends with it.
Channels are `channel.Channel`. No task runs per message; no third-party client.

A connection to this broker itself ("amqp://" with no host) runs over a socket from the
gateway's `DirectConnector` (RabbitMQ's direct connection): the same bytes, no network.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import Final, Protocol, cast

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import AMQPError
from streamq import __version__
from streamq.links.amqp.channel import Channel
from streamq.links.amqp.errors import AmqpConnectionError, ChannelClosedError, mark_retrieved
from streamq.links.amqp.uri import AmqpUri
from streamq.links.amqp.wire import (
    Assembly,
    Confirm,
    Delivery,
    DeliveryRun,
    Event,
    MethodFrame,
    PublishWriter,
    Returned,
    scan,
)

__all__ = [
    "AmqpConnectionError",
    "Channel",
    "ChannelClosedError",
    "Connection",
    "Delivery",
    "DirectConnector",
]

logger = logging.getLogger(__name__)

FRAME_MAX: Final = 131072  # what we ask for; a smaller offer of the broker wins
CHANNEL_MAX: Final = 2047  # what we ask for (RabbitMQ's default), likewise
RECV_BUFFER_BYTES: Final = 1 << 20
RECV_FREE_BYTES_MIN: Final = 64 << 10  # compact the buffer before a read below this
FLUSH_BYTES: Final = 256 << 10  # write at once rather than at the end of the loop turn
WRITE_BUFFER_HIGH_BYTES: Final = 4 << 20  # `writable()` waits above this
CLOSE_TIMEOUT_S: Final = 5.0  # wait this long for close-ok before dropping the socket
_CAPABILITIES: Final[codec.FieldTable] = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    # A refused login is a connection.close 403 to report, not a dropped socket.
    "authentication_failure_close": True,
}
_HANDSHAKE_STATES: Final = ("start", "tune", "open")


class DirectConnector(Protocol):
    """This broker's direct connections ("amqp://" with no host)."""

    def open(self, user: str) -> socket.socket:
        """A connected socket whose other end is an AMQP session of this broker that logs
        in as `user` whatever credentials the client sends."""
        ...


class Connection(asyncio.BufferedProtocol):
    """An open connection. Use `Connection.connect` to make one."""

    def __init__(self, uri: AmqpUri, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.uri = uri
        self.name = name
        self.loop = loop
        self.closed: asyncio.Future[None] = loop.create_future()
        self.closed.add_done_callback(mark_retrieved)
        self._opened: asyncio.Future[None] = loop.create_future()
        self._opened.add_done_callback(mark_retrieved)
        self.blocked = False  # connection.blocked received and not yet unblocked
        self.blocked_reason = ""
        self._write_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self.output = bytearray()  # frames for the next write
        self._flush_scheduled = False
        self.frame_max = FRAME_MAX
        self.channel_max = CHANNEL_MAX
        self.heartbeat_s = 0
        self.writer = PublishWriter(FRAME_MAX)
        self._buffer = bytearray(RECV_BUFFER_BYTES + 2 * FRAME_MAX)
        self._view = memoryview(self._buffer)
        self._start = 0
        self._end = 0
        self._assembly = Assembly()
        self.channels: dict[int, Channel] = {}
        self._closing_ids: set[int] = set()  # channels we closed, close-ok not yet in
        self._transport: asyncio.Transport | None = None
        self._state = "start"  # start, tune, open, opened, closing, closed
        self._heartbeat: asyncio.TimerHandle | None = None
        self._received_s = self._sent_s = time.monotonic()

    @classmethod
    async def connect(
        cls, uri: AmqpUri, *, name: str, direct: DirectConnector | None = None
    ) -> Connection:
        """Connect, log in and open `uri`'s vhost within its connection_timeout. Raises
        AmqpConnectionError saying what failed."""
        loop = asyncio.get_running_loop()
        connection = cls(uri, name, loop)
        where = uri.address()
        try:
            async with asyncio.timeout(uri.connection_timeout_s):
                await connection._open_transport(direct)
                await asyncio.shield(connection._opened)
        except TimeoutError:
            connection._fail(AmqpConnectionError(_timed_out(uri, connection._state)))
            raise AmqpConnectionError(_timed_out(uri, connection._state)) from None
        except ConnectionRefusedError:
            raise AmqpConnectionError(f"connection refused by {where}") from None
        except ssl.SSLCertVerificationError as exc:
            reason = f"certificate verify failed: {exc.verify_message}"
            raise AmqpConnectionError(f"TLS handshake with {where} failed: {reason}") from None
        except ssl.SSLError as exc:
            reason = exc.reason or str(exc)
            raise AmqpConnectionError(f"TLS handshake with {where} failed: {reason}") from None
        except OSError as exc:
            raise AmqpConnectionError(f"cannot connect to {where}: {exc.strerror or exc}") from None
        except asyncio.CancelledError:
            connection._fail(AmqpConnectionError("connect cancelled"))
            raise
        return connection

    async def _open_transport(self, direct: DirectConnector | None) -> None:
        uri = self.uri
        if uri.local:
            if direct is None:
                raise AmqpConnectionError("amqp:// with no host needs this broker's gateway")
            sock = direct.open(uri.username)
            await self.loop.create_connection(lambda: self, sock=sock)
            return
        await self.loop.create_connection(
            lambda: self,
            uri.host,
            uri.port,
            ssl=uri.tls,
            server_hostname=uri.server_hostname if uri.tls is not None else None,
        )

    async def channel(self) -> Channel:
        """Open a new channel. Raises AmqpConnectionError when none is free or the
        connection ends first."""
        self._check_open()
        taken = self.channels.keys() | self._closing_ids
        number = next((n for n in range(1, self.channel_max + 1) if n not in taken), None)
        if number is None:
            raise AmqpConnectionError(f"all {self.channel_max} channels are in use")
        channel = Channel(self, number)
        self.channels[number] = channel
        await channel.call(m.ChannelOpen(), m.ChannelOpenOk)
        return channel

    async def close(self) -> None:
        """Close politely: connection.close, then close-ok or CLOSE_TIMEOUT_S. `closed`
        then holds None (unless the connection had already failed)."""
        if self.closed.done():
            return
        if self._state != "opened":
            self._fail(AmqpConnectionError("closed during the handshake"))
            return
        self._state = "closing"
        self.send_method(0, m.ConnectionClose(200, "Goodbye", 0, 0))
        self.flush()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await asyncio.shield(self.closed)
        except TimeoutError:
            self._finish_close()
        except AmqpConnectionError:
            pass  # it failed meanwhile; `closed` says how

    async def writable(self) -> None:
        """Return once the write buffer is below its high-water mark and the broker has
        not blocked the connection. Raises the connection's error if it ends first."""
        while not self._writable.is_set():
            self._check_open()
            await self._writable.wait()
        self._check_open()

    # -- output ----------------------------------------------------------------------------

    def send_method(self, channel: int, method: m.Method) -> None:
        codec.append_method_frame(self.output, codec.ChannelId(channel), method)
        self.note_output()

    def note_output(self) -> None:
        """Frames were appended to `output`: write them at the end of this loop turn, or
        now if there is a lot."""
        if len(self.output) >= FLUSH_BYTES:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if not self.output or transport is None or transport.is_closing():
            return
        # The transport may keep the buffer it is given: hand it over, start a new one.
        data, self.output = self.output, bytearray()
        transport.write(data)
        self._sent_s = time.monotonic()

    # -- socket events ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        self.output += codec.PROTOCOL_HEADER_0_9_1
        self.flush()

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buffer) - self._end < RECV_FREE_BYTES_MIN:
            rest = self._end - self._start
            self._buffer[:rest] = self._buffer[self._start : self._end]
            self._start, self._end = 0, rest
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        self._received_s = time.monotonic()
        if self._state in _HANDSHAKE_STATES and self._buffer.startswith(b"AMQP", self._start):
            self._fail(AmqpConnectionError(f"{self.uri.address()} does not speak AMQP 0-9-1"))
            return
        try:
            events, self._start = scan(
                self._buffer, self._start, self._end, self.frame_max, self._assembly
            )
        except AMQPError as exc:
            self._protocol_error(exc.reply_code, str(exc))
            return
        if self._start == self._end:
            self._start = self._end = 0
        try:
            self._dispatch(events)
        except AmqpConnectionError as exc:
            self._protocol_error(505, str(exc))
        except AMQPError as exc:
            self._protocol_error(exc.reply_code, str(exc))
        except Exception as exc:  # a bug in a consumer's or confirm handler
            logger.exception("link connection %s: a handler failed", self.name)
            self._fail(AmqpConnectionError(f"internal error in a handler: {exc!r}"))

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_writable()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_writable()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._state == "closing":
            self._finish_close()
            return
        where = self.uri.address()
        if self._state == "open":
            # Old brokers drop a refused login without connection.close.
            why = f"{where} closed the connection during the handshake (login refused?)"
        elif self._state in _HANDSHAKE_STATES:
            why = f"{where} closed the connection during the handshake"
        else:
            cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            why = f"connection to {where} lost: {cause or 'closed by the peer'}"
        self._fail(AmqpConnectionError(why))

    # -- events ----------------------------------------------------------------------------

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            if self._state == "closed":
                return
            kind = type(event)
            if kind is DeliveryRun:
                run = cast(DeliveryRun, event)
                channel = self.channels.get(run.channel)
                if channel is not None:
                    channel.take_run(run)
            elif kind is Confirm:
                confirm = cast(Confirm, event)
                channel = self.channels.get(confirm.channel)
                if channel is not None:
                    channel.take_confirm(confirm.delivery_tag, confirm.multiple, confirm.ack)
            elif kind is MethodFrame:
                frame = cast(MethodFrame, event)
                self._take_method(frame.channel, codec.decode_method(frame.payload))
            else:
                returned = cast(Returned, event)
                channel = self.channels.get(returned.channel)
                if channel is not None and channel.on_return is not None:
                    channel.on_return(returned.method, returned.properties, returned.body)

    def _take_method(self, channel_id: int, method: m.Method) -> None:
        if channel_id == 0:
            self._connection_method(method)
            return
        channel = self.channels.get(channel_id)
        if channel is not None:
            channel.take_method(method)
        elif channel_id in self._closing_ids:
            # The rest of a channel we closed: only its close-ok matters (spec 2.3.7:
            # after sending channel.close, discard all but close and close-ok).
            if isinstance(method, m.ChannelCloseOk):
                self._closing_ids.discard(channel_id)
            elif isinstance(method, m.ChannelClose):
                self.send_method(channel_id, m.ChannelCloseOk())
        else:
            raise AmqpConnectionError(f"{method.NAME} on channel {channel_id}, which is not open")

    def _connection_method(self, method: m.Method) -> None:
        if isinstance(method, m.ConnectionStart) and self._state == "start":
            self._start_ok(method)
        elif isinstance(method, m.ConnectionTune) and self._state == "tune":
            self._tune_ok(method)
        elif isinstance(method, m.ConnectionOpenOk) and self._state == "open":
            self._state = "opened"
            self._opened.set_result(None)
            if self.heartbeat_s:
                self._schedule_heartbeat()
        elif isinstance(method, m.ConnectionClose):
            self.send_method(0, m.ConnectionCloseOk())
            self.flush()
            error = AmqpConnectionError(
                f"{self.uri.address()} closed the connection: {method.reply_text}",
                method.reply_code,
            )
            self._fail(error, abort=False)
        elif isinstance(method, m.ConnectionCloseOk) and self._state == "closing":
            self._finish_close()
        elif isinstance(method, m.ConnectionBlocked):
            self.blocked, self.blocked_reason = True, method.reason
            self._update_writable()
        elif isinstance(method, m.ConnectionUnblocked):
            self.blocked, self.blocked_reason = False, ""
            self._update_writable()
        else:
            raise AmqpConnectionError(f"unexpected {method.NAME} in state {self._state}")

    def _start_ok(self, start: m.ConnectionStart) -> None:
        uri = self.uri
        mechanism = uri.auth_mechanism
        if mechanism.encode() not in start.mechanisms.split():
            offered = start.mechanisms.decode(errors="replace")
            raise AmqpConnectionError(f"the broker offers {offered}, not {mechanism}")
        response = b"" if mechanism == "EXTERNAL" else f"\0{uri.username}\0{uri.password}".encode()
        properties: codec.FieldTable = {
            "product": "streamq",
            "version": __version__,
            "platform": "Python",
            "information": "streamq shovel and federation links",
            "connection_name": self.name,
            "capabilities": dict(_CAPABILITIES),
        }
        self.send_method(0, m.ConnectionStartOk(properties, mechanism, response, "en_US"))
        self._state = "tune"

    def _tune_ok(self, tune: m.ConnectionTune) -> None:
        uri = self.uri
        self.channel_max = _negotiate(uri.channel_max or CHANNEL_MAX, tune.channel_max)
        self.frame_max = _negotiate(uri.frame_max or FRAME_MAX, tune.frame_max)
        self.frame_max = max(codec.FRAME_MIN_SIZE, min(self.frame_max, FRAME_MAX))
        self.heartbeat_s = _negotiate(uri.heartbeat_s, tune.heartbeat)
        self.writer = PublishWriter(self.frame_max)
        ok = m.ConnectionTuneOk(self.channel_max, self.frame_max, self.heartbeat_s)
        self.send_method(0, ok)
        self.send_method(0, m.ConnectionOpen(virtual_host=uri.vhost))
        self._state = "open"

    # -- heartbeats --------------------------------------------------------------------------

    def _schedule_heartbeat(self) -> None:
        self._heartbeat = self.loop.call_later(self.heartbeat_s / 2, self._on_heartbeat)

    def _on_heartbeat(self) -> None:
        """Every half interval: send a heartbeat if we sent nothing meanwhile, and give up
        on a broker we heard nothing from for two intervals (as RabbitMQ's clients do)."""
        now = time.monotonic()
        silent_s = now - self._received_s
        if silent_s > 2 * self.heartbeat_s:
            message = (
                f"missed heartbeats from {self.uri.address()}: nothing received for "
                f"{silent_s:.1f} s (heartbeat {self.heartbeat_s} s)"
            )
            self._fail(AmqpConnectionError(message))
            return
        if now - self._sent_s >= self.heartbeat_s / 2:
            self.output += codec.HEARTBEAT_FRAME
            self.flush()
        self._schedule_heartbeat()

    # -- endings ---------------------------------------------------------------------------

    def _protocol_error(self, reply_code: int, text: str) -> None:
        """The broker broke the protocol: tell it (connection.close), then drop it."""
        if self._transport is not None and self._state == "opened":
            self.send_method(0, m.ConnectionClose(reply_code, text[:255], 0, 0))
            self.flush()
        self._fail(AmqpConnectionError(f"protocol error from {self.uri.address()}: {text}"))

    def _fail(self, error: AmqpConnectionError, *, abort: bool = True) -> None:
        """End the connection with `error`: every channel and waiter gets it."""
        if self._state == "closed":
            return
        self._state = "closed"
        if not self.closed.done():
            self.closed.set_exception(error)
        self._end_all(error)
        transport = self._transport
        if transport is not None:
            if abort:
                transport.abort()
            else:
                transport.close()  # after the close-ok just written

    def _finish_close(self) -> None:
        """Our own close completed (or timed out)."""
        if self._state == "closed":
            return
        self._state = "closed"
        if not self.closed.done():
            self.closed.set_result(None)
        self._end_all(None)
        if self._transport is not None:
            self._transport.close()

    def _end_all(self, error: AmqpConnectionError | None) -> None:
        if not self._opened.done():
            self._opened.set_exception(error or AmqpConnectionError("closed"))
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        for channel in list(self.channels.values()):
            channel.connection_closed(error)
        self.channels.clear()
        self._writable.set()  # writers wake up and find the connection closed

    def forget_channel(self, channel: Channel, *, keep_number: bool) -> None:
        if self.channels.get(channel.id) is channel:
            del self.channels[channel.id]
        if keep_number and self._state != "closed":
            self._closing_ids.add(channel.id)

    def _update_writable(self) -> None:
        if self._write_paused or self.blocked:
            self._writable.clear()
        else:
            self._writable.set()

    def _check_open(self) -> None:
        if self.closed.done():
            error = self.closed.exception()
            raise error if error is not None else AmqpConnectionError("connection closed")
        if self._state == "closing":
            raise AmqpConnectionError("connection closing")


def _negotiate(client: int, server: int) -> int:
    """RabbitMQ's Erlang client: the larger when either is 0 (no limit), else the smaller."""
    if client == 0 or server == 0:
        return max(client, server)
    return min(client, server)


def _timed_out(uri: AmqpUri, state: str) -> str:
    step = "connecting to" if state == "start" else "in the handshake with"
    return f"timed out {step} {uri.address()} after {uri.connection_timeout_s:g} s"
