"""A minimal blocking AMQP 0-9-1 client for the load generator's set-up and tear-down.

Owns one connection over a socket (TCP, or TLS for amqps://): the handshake (PLAIN,
heartbeats off), channel 1, synchronous calls (`call`) and a clean close. It turns every
way a broker can refuse or drop us (refused connection, timeout, a failed TLS handshake,
connection.close, channel.close, a malformed frame) into `PerfError` with a one-line
message. The per-message work (publishes, deliveries, confirms) is not here: the
publisher and consumer take over `sock` and `buffer` once set-up is done. Every read
waits at most `timeout_s`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Final, TypeVar

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import ConnectionException
from streamq.perf.errors import PerfError
from streamq.perf.uri import AmqpUri
from streamq.perf.wire import CHANNEL, RecvBuffer

IO_TIMEOUT_S: Final = 10.0
# A publisher's batch waits this long for the broker to read any of it: flow control and
# alarms stop a broker reading for a while (RabbitMQ paging a long queue, for seconds on
# end), and a load generator waits for them as PerfTest and lavinmqperf do.
PUBLISH_STALL_S: Final = 120.0
_SEND_POLL_S: Final = 0.05
"""The longest wait for any reply, and for the socket to take our writes."""
CLOSE_TIMEOUT_S: Final = 2.0
FRAME_MAX: Final = 131072
"""What we ask for in tune-ok; the broker's smaller offer wins."""
SOCKET_BUFFER_BYTES: Final = 4 << 20
_CLIENT_PROPERTIES: Final[codec.FieldTable] = {
    "product": "streamq perf",
    # authentication_failure_close: a refused login is a connection.close 403 to tell,
    # not a dropped socket (RabbitMQ and streamq drop clients that do not announce it).
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "authentication_failure_close": True,
    },
}
_M = TypeVar("_M", bound=m.Method)


def describe_close(method: m.ConnectionClose | m.ChannelClose) -> str:
    return f"{method.reply_code} {method.reply_text}"


class AmqpClient:
    """One open connection with channel 1 open. Use `connect` to make one."""

    def __init__(self, sock: socket.socket, frame_max: int) -> None:
        self.sock = sock
        self.frame_max = frame_max
        self.buffer = RecvBuffer(frame_max)
        self._frames: list[codec.Frame] = []

    @classmethod
    def connect(cls, uri: AmqpUri, *, timeout_s: float = IO_TIMEOUT_S) -> AmqpClient:
        """Connect, log in and open channel 1. Raises `PerfError` on any failure."""
        sock = open_socket(uri, timeout_s)
        client = cls(sock, codec.FRAME_MIN_SIZE)
        try:
            client.handshake(uri)
            client.call(m.ChannelOpen(), m.ChannelOpenOk)
        except BaseException:
            sock.close()
            raise
        return client

    def handshake(self, uri: AmqpUri) -> None:
        self.send(codec.PROTOCOL_HEADER_0_9_1)
        self.wait(0, m.ConnectionStart)
        response = f"\0{uri.username}\0{uri.password}".encode()
        start_ok = m.ConnectionStartOk(_CLIENT_PROPERTIES, "PLAIN", response, "en_US")
        self.send_method(start_ok, channel=0)
        tune = self.wait(0, m.ConnectionTune)
        frame_max = min(tune.frame_max or FRAME_MAX, FRAME_MAX)
        self.send_method(m.ConnectionTuneOk(tune.channel_max, frame_max, 0), channel=0)
        self.frame_max = self.buffer.frame_max = frame_max
        self.send_method(m.ConnectionOpen(virtual_host=uri.vhost), channel=0)
        self.wait(0, m.ConnectionOpenOk)

    def send(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise PerfError("timed out writing to the broker") from None
        except OSError as exc:
            raise PerfError(f"connection lost: {exc.strerror or exc}") from None

    def send_batch(
        self, data: bytes | bytearray | memoryview, stopping: Callable[[], bool]
    ) -> bool:
        """Write all of `data` while the broker reads some of it at least every
        PUBLISH_STALL_S; False if `stopping()` turned true first (the connection is then
        mid-frame: `abort` it). Raises `PerfError` on a stall or a lost connection."""
        view = memoryview(data)
        progress_s = time.monotonic()
        while view:
            _, writable, _ = select.select([], [self.sock], [], _SEND_POLL_S)
            if writable:
                try:
                    view = view[self.sock.send(view) :]
                except OSError as exc:
                    raise PerfError(f"connection lost: {exc.strerror or exc}") from None
                progress_s = time.monotonic()
            elif stopping():
                return False
            elif time.monotonic() - progress_s > PUBLISH_STALL_S:
                raise PerfError(f"the broker read nothing for {PUBLISH_STALL_S:g} s")
        return True

    def readable(self, timeout_s: float) -> bool:
        """Whether a read would return at once, waiting up to `timeout_s`. TLS may hold
        decrypted bytes that the socket no longer shows as readable."""
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return True
        readable, _, _ = select.select([self.sock], [], [], timeout_s)
        return bool(readable)

    def abort(self) -> None:
        """Close the socket without the close handshake (after a batch cut mid-frame)."""
        self.sock.close()

    def send_method(self, method: m.Method, *, channel: int = CHANNEL) -> None:
        self.send(codec.encode_method_frame(codec.ChannelId(channel), method))

    def call(self, method: m.Method, reply: type[_M]) -> _M:
        """Send a synchronous method on channel 1 and wait for its reply."""
        self.send_method(method)
        return self.wait(CHANNEL, reply)

    def wait(self, channel: int, reply: type[_M], *, timeout_s: float = IO_TIMEOUT_S) -> _M:
        """Wait for `reply` on `channel`, skipping content and other methods. Raises
        `PerfError` on a close from the broker or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            frames = self.take_frames(deadline, reply.NAME)
            for index, frame in enumerate(frames):
                method = self.method_of(frame)
                if isinstance(method, reply) and frame.channel == channel:
                    # Frames after the reply (deliveries, say) are for whoever reads next.
                    self._frames = frames[index + 1 :]
                    return method

    def take_frames(self, deadline: float, waiting_for: str) -> list[codec.Frame]:
        """The frames already received, else those of one more read before `deadline`."""
        if not self._frames:
            self.fill(deadline, waiting_for)
            self._frames = self.split()
        frames, self._frames = self._frames, []
        return frames

    def leftover_frames(self) -> list[codec.Frame]:
        """Frames a set-up call read past its reply (e.g. deliveries after consume-ok)."""
        frames, self._frames = self._frames, []
        return frames

    def fill(self, deadline: float, waiting_for: str) -> None:
        """Read once, waiting until `deadline`. Raises `PerfError` on timeout or EOF."""
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise PerfError(f"timed out waiting for {waiting_for}")
        self.sock.settimeout(remaining_s)
        try:
            self.buffer.fill(self.sock)
        except TimeoutError:
            raise PerfError(f"timed out waiting for {waiting_for}") from None
        except OSError as exc:
            raise PerfError(f"connection lost: {exc.strerror or exc}") from None

    def split(self) -> list[codec.Frame]:
        try:
            return self.buffer.split()
        except ConnectionException as exc:
            raise PerfError(f"bad frame from the broker: {exc}") from None

    def method_of(self, frame: codec.Frame) -> m.Method | None:
        """Decode a method frame; raise `PerfError` for a close from the broker."""
        if frame.frame_type != codec.FRAME_METHOD:
            return None
        try:
            method = codec.decode_method(frame.payload)
        except ConnectionException as exc:
            raise PerfError(f"bad frame from the broker: {exc}") from None
        if isinstance(method, m.ConnectionClose):
            self.send_quietly(m.ConnectionCloseOk(), channel=0)
            raise PerfError(f"connection closed by the broker: {describe_close(method)}")
        if isinstance(method, m.ChannelClose):
            self.send_quietly(m.ChannelCloseOk(), channel=frame.channel)
            raise PerfError(f"channel closed by the broker: {describe_close(method)}")
        return method

    def send_quietly(self, method: m.Method, *, channel: int) -> None:
        # We are reporting the broker's close; a lost close-ok changes nothing.
        with contextlib.suppress(OSError):
            self.sock.sendall(codec.encode_method_frame(codec.ChannelId(channel), method))

    def close(self) -> None:
        """Close the connection politely, waiting up to CLOSE_TIMEOUT_S for close-ok, and
        then the socket. Deliveries still arriving are discarded."""
        try:
            self.send_method(m.ConnectionClose(200, "bye"), channel=0)
            self.wait(0, m.ConnectionCloseOk, timeout_s=CLOSE_TIMEOUT_S)
        except PerfError:
            pass  # The broker already went away or is slow; the socket closes anyway.
        finally:
            self.sock.close()


def open_socket(uri: AmqpUri, timeout_s: float) -> socket.socket:
    """A connected TCP socket with Nagle off, with TLS for amqps://. Raises `PerfError`
    when refused or when the TLS handshake fails."""
    sock = _tcp_socket(uri, timeout_s)
    return _with_tls(sock, uri) if uri.tls else sock


def _with_tls(sock: socket.socket, uri: AmqpUri) -> ssl.SSLSocket:
    try:
        context = ssl.create_default_context(cafile=uri.cacertfile or None)
    except OSError as exc:
        sock.close()
        raise PerfError(f"cannot read cacertfile {uri.cacertfile!r}: {exc}") from None
    if not uri.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        return context.wrap_socket(sock, server_hostname=uri.host)
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise PerfError(f"TLS handshake with {uri.address()} failed: {exc}") from None


def _tcp_socket(uri: AmqpUri, timeout_s: float) -> socket.socket:
    try:
        sock = socket.create_connection((uri.host, uri.port), timeout=timeout_s)
    except ConnectionRefusedError:
        raise PerfError(f"connection refused by {uri.address()}") from None
    except TimeoutError:
        raise PerfError(f"timed out connecting to {uri.address()}") from None
    except OSError as exc:
        raise PerfError(f"cannot connect to {uri.address()}: {exc.strerror or exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
    return sock
