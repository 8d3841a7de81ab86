"""One stream protocol connection: bytes read to commands, replies and deliveries written.

Owns `StreamSession`, the asyncio Protocol of one connection: it splits what the socket
reads into frames under the negotiated frame_max (refusing an oversized size header before
its body is buffered), hands Publish frames to the publish fast path without decoding
their messages, decodes every other frame with the sans-IO codec and dispatches it by
type and connection state (`dispatch.py`), writes one buffer per read and per delivery
round, pauses deliveries while the transport's write buffer is above its high mark, runs
heartbeats and the handshake timeout, and closes with the protocol's codes. Bad input
closes the connection with Close(code) and never raises out of a callback.

It must not open listeners (server.py) nor hold state that all connections share
(`StreamGateway`); the handlers of each command group live in their own modules.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from enum import IntEnum
from typing import TYPE_CHECKING, Final, cast

from stream_gateway import dispatch
from stream_gateway.codec import StreamCodecError, decode, encode, split_frames
from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, ResponseCode
from stream_gateway.errors import CloseConnection, StreamError, response_code
from streamq.broker.accounts import PermissionKind
from streamq.broker.errors import BrokerError
from streamq.broker.vhost import VHost
from streamq.log_fields import CONNECTION, USER, VHOST

if TYPE_CHECKING:
    from stream_gateway.publishers import Publisher
    from stream_gateway.server import StreamGateway
    from stream_gateway.subscriptions import Subscription

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S: Final = 10.0  # RabbitMQ's handshake_timeout: open within this
CLOSE_TIMEOUT_S: Final = 3.0  # after our Close, wait this long for its response
WRITE_BUFFER_HIGH_BYTES: Final = 4 * 1024 * 1024  # deliveries pause above this
_HEADER: Final = struct.Struct(">HH")


class State(IntEnum):
    """Where the handshake is: each command is legal in the states `dispatch` lists."""

    PEER_PROPERTIES = 0
    SASL_HANDSHAKE = 1
    SASL_AUTHENTICATE = 2
    TUNE = 3
    OPEN = 4  # waiting for Open
    OPENED = 5
    CLOSING = 6  # our Close went out; only its response is read
    CLOSED = 7


class StreamSession(asyncio.Protocol):
    """One client connection of the stream protocol."""

    def __init__(self, gateway: StreamGateway) -> None:
        self.gateway = gateway
        self.broker = gateway.broker
        self.state = State.PEER_PROPERTIES
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.host, self.port, self.peer_host, self.peer_port = "", 0, "", 0
        self._buffer = bytearray()  # at most frame_max plus one read
        self.out = bytearray()  # written once per read and per delivery round
        self.frame_max = gateway.frame_max  # enforced on what the peer sends
        self.heartbeat_s = gateway.heartbeat_s
        self.client_properties: dict[str, str] = {}
        self.user = ""
        self.auth_mechanism = ""
        self.vhost: VHost | None = None
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.deliver_v2 = False  # the client said it reads Deliver v2 (committed offset)
        self.write_paused = False
        self.socket_fd = -1  # >= 0: the plain socket's descriptor, for os.sendfile
        self.blocked = False  # not read while a resource alarm lasts (it publishes)
        self.connected_at_ms = int(time.time() * 1000)
        self.recv_oct = 0
        self.send_oct = 0
        self._last_read_s = time.monotonic()
        self._last_write_s = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._correlation_id = 0  # of the requests this server sends (ConsumerUpdate, Close)
        self.registered = False  # listed in Broker.clients
        self._open_logged = False  # its close is logged too (connection_lost)

    # -- socket events -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        # Plain TCP (or a Unix socket): chunks may go by os.sendfile; TLS: a copy.
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self.socket_fd = sock.fileno()
        own = transport.get_extra_info("sockname")
        peer = transport.get_extra_info("peername")
        if isinstance(own, tuple) and isinstance(peer, tuple):
            self.host, self.port = str(own[0]), int(own[1])
            self.peer_host, self.peer_port = str(peer[0]), int(peer[1])
            self.peer = f"{self.peer_host}:{self.peer_port}"
        self.gateway.sessions.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)

    @property
    def name(self) -> str:
        """As the management API names it; the peer alone for a socket that is not IP."""
        if not self.peer_host:
            return self.peer
        return f"{self.peer_host}:{self.peer_port} -> {self.host}:{self.port}"

    def log_fields(self) -> dict[str, object]:
        """The structured fields of this connection's log lines (streamq/log_fields.py)."""
        fields: dict[str, object] = {CONNECTION: self.name}
        if self.user:
            fields[USER] = self.user
        if self.vhost is not None:
            fields[VHOST] = self.vhost.name
        return fields

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = State.CLOSED
        if self._open_logged:
            self._open_logged = False
            logger.info("closed stream connection %s", self.name, extra=self.log_fields())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.gateway.forget(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.gateway.drain_session(self)

    def data_received(self, data: bytes) -> None:
        if self.state is State.CLOSED:
            return
        self.recv_oct += len(data)
        self._last_read_s = time.monotonic()
        buffer = self._buffer
        buffer += data
        try:
            while buffer and self.is_open():
                frames, used = split_frames(buffer, self.frame_max)
                if not frames:
                    break
                del buffer[:used]
                for frame in frames:
                    self._handle_frame(frame)
                    if not self.is_open():
                        break
        except StreamCodecError as exc:
            self.close_with(exc.response_code, str(exc))
        except CloseConnection as exc:
            self.close_with(exc.code, exc.reason)
        except Exception:
            logger.exception(
                "stream connection %s: internal error", self.peer, extra=self.log_fields()
            )
            self.close_with(ResponseCode.INTERNAL_ERROR, "internal error")
        self.flush()

    def is_open(self) -> bool:
        """Whether frames are still read (a handler may have closed the connection)."""
        return self.state is not State.CLOSED

    def _handle_frame(self, frame: bytes) -> None:
        if self.state is State.CLOSING:
            self._closing_frame(frame)
            return
        key, version = _HEADER.unpack_from(frame, 0)
        if key == Key.PUBLISH and self.state is State.OPENED and version in (1, 2):
            # The hot path: the messages are parsed by the storage side (in C), never
            # one Python object each here.
            dispatch.publish(self, frame, version)
            return
        command = decode(frame)
        handler = dispatch.handler(self.state, command)
        if handler is None:
            raise CloseConnection(
                ResponseCode.UNKNOWN_FRAME, f"unexpected {type(command).__name__} here"
            )
        try:
            handler(self, command)
        except StreamError as exc:
            dispatch.refuse(self, command, exc.code)
        except BrokerError as exc:
            dispatch.refuse(self, command, response_code(exc))

    def _closing_frame(self, frame: bytes) -> None:
        """After our Close only its response matters; it ends the connection."""
        key, _version = _HEADER.unpack_from(frame, 0)
        if key == Key.CLOSE | 0x8000 and self.transport is not None:
            self.flush()
            self.transport.close()
            self.state = State.CLOSED

    def hold_for_alarm(self, blocked: bool) -> None:
        """Stop or resume reading from the socket for a resource alarm."""
        if blocked == self.blocked or self.transport is None or self.state is State.CLOSED:
            return
        self.blocked = blocked
        if blocked:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    # -- writing -------------------------------------------------------------------------

    def send(self, command: c.Command) -> None:
        encode(command, self.out)

    def flush(self) -> None:
        out = self.out
        if out and self.transport is not None and not self.transport.is_closing():
            self.send_oct += len(out)
            self.transport.write(bytes(out))
            self._last_write_s = time.monotonic()
        out.clear()

    def next_correlation_id(self) -> int:
        self._correlation_id = (self._correlation_id + 1) & 0xFFFFFFFF
        return self._correlation_id

    # -- closing -------------------------------------------------------------------------

    def close_with(self, code: ResponseCode, reason: str) -> None:
        """Send Close(code) and stop reading commands; the connection ends when the
        response arrives or after CLOSE_TIMEOUT_S."""
        if self.state in (State.CLOSING, State.CLOSED) or self.transport is None:
            return
        if code != ResponseCode.OK:
            logger.warning(
                "closing stream connection %s: %s (%s)",
                self.peer,
                reason,
                code.name,
                extra=self.log_fields(),
            )
        self.state = State.CLOSING
        self._buffer = bytearray()  # a new one: a codec error may hold a view of the old
        self.gateway.release(self)
        self.send(c.Close(self.next_correlation_id(), code, reason[:200]))
        self.flush()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, self.abort)

    def hang_up(self, reason: str) -> None:
        """The management API's close, as RabbitMQ 3.10: no Close frame, which clients
        expect only as a reply (rabbitmq-stream-js-client throws "Unknown response 22",
        rstream's handler fails and never answers), but the end of the stream: what is
        buffered goes out, then a FIN; what the client still sends is discarded until
        it hangs up, CLOSE_TIMEOUT_S at most. Every client sees its connection closed."""
        transport = self.transport
        if self.state is State.CLOSED or transport is None:
            return
        logger.info("closing stream connection %s: %s", self.peer, reason, extra=self.log_fields())
        self.flush()
        self.gateway.release(self)
        self.state = State.CLOSED
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not transport.can_write_eof():  # TLS: no half-close
            transport.close()
            return
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, self.abort)

    def close_now(self) -> None:
        """Write what is buffered and close the socket (after a final response)."""
        self.flush()
        self.gateway.release(self)
        self.state = State.CLOSED
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.state = State.CLOSED
        if self.transport is not None:
            self.transport.abort()

    # -- timers --------------------------------------------------------------------------

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.state < State.OPENED:
            logger.warning(
                "stream connection %s: no Open within %g s", self.peer, HANDSHAKE_TIMEOUT_S
            )
            self.abort()

    def open_channel_count(self) -> int:
        """The stream protocol has no channels (for streamq/broker/connection_tracking.py)."""
        return 0

    def opened(self) -> None:
        """The handshake is done: heartbeats take over the timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.state = State.OPENED
        self._open_logged = True
        vhost = self.vhost.name if self.vhost is not None else ""
        logger.info(
            "accepted stream connection %s: user '%s' granted access to vhost '%s'",
            self.name,
            self.user,
            vhost,
            extra=self.log_fields(),
        )
        if self.heartbeat_s > 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.heartbeat_s, self._heartbeat)

    def _heartbeat(self) -> None:
        """Send a heartbeat when nothing went out for a period; drop a peer silent for
        two periods (RabbitMQ's rule)."""
        self._timer = None
        if self.state is not State.OPENED:
            return
        now_s = time.monotonic()
        if now_s - self._last_read_s > 2 * self.heartbeat_s:
            logger.warning(
                "stream connection %s: missed heartbeats", self.peer, extra=self.log_fields()
            )
            self.abort()
            return
        if now_s - self._last_write_s >= self.heartbeat_s / 2:
            self.send(c.Heartbeat())
            self.flush()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.heartbeat_s / 2, self._heartbeat)

    # -- access ----------------------------------------------------------------------------

    def check(self, kind: PermissionKind, stream: str) -> None:
        """Raises StreamError(ACCESS_REFUSED) unless the user may `kind` the stream."""
        assert self.vhost is not None
        if not self.broker.accounts.permitted(self.user, self.vhost.name, kind, stream):
            raise StreamError(ResponseCode.ACCESS_REFUSED, f"{kind} access to {stream} refused")

    def current_vhost(self) -> VHost:
        vhost = self.vhost
        assert vhost is not None
        return vhost
