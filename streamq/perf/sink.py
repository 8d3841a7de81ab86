"""`streamq perf sink`: a null AMQP broker, to measure the load generator's own ceiling.

Owns a loopback server that does just enough AMQP 0-9-1 for `streamq perf`: the
handshake (any PLAIN login), channels, queue and exchange methods answered with their
`-ok` and nothing stored, publishes discarded unread (confirmed with one multiple ack
per read in confirm mode), tx methods answered, and for each basic.consume an endless
stream of pre-encoded deliveries of `--size` bytes (stamped, so `-l` works), held to the
prefetch window when the consumer acks (acks are settled per read, the highest tag
standing for all below it). One thread per connection; each read and write
waits at most `IO_TIMEOUT_S`. Unknown methods close the connection with 540.
"""

from __future__ import annotations

import select
import signal
import socket
import socketserver
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.errors import ConnectionException
from streamq.perf.errors import PerfError
from streamq.perf.wire import DeliveryBatch, RecvBuffer, scan_publishes

FRAME_MAX: Final = 131072
IO_TIMEOUT_S: Final = 30.0
POLL_S: Final = 0.5
LISTEN_BACKLOG: Final = 1024
_NOT_IMPLEMENTED: Final = 540


@dataclass
class Stream:
    """Deliveries flowing to one consumer: tags sent and (unless no-ack) acked."""

    batch: DeliveryBatch
    no_ack: bool
    prefetch: int
    delivered: int = 0
    acked: int = 0

    def room(self) -> int:
        if self.no_ack or not self.prefetch:
            return self.batch.count_max
        return min(self.batch.count_max, self.prefetch - (self.delivered - self.acked))


class Closed(Exception):
    """The client closed the connection (or went away): end this connection's thread."""


class SinkConnection:
    def __init__(self, sock: socket.socket, body_bytes: int) -> None:
        self.sock = sock
        self.body_bytes = body_bytes
        self.buffer = RecvBuffer(FRAME_MAX)
        self.out = bytearray()
        self.confirming: dict[int, int] = {}  # channel -> publishes so far
        self.prefetch: dict[int, int] = {}
        self.streams: dict[int, Stream] = {}
        self.queues = 0

    def run(self) -> None:
        self.sock.settimeout(IO_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.read_protocol_header()
            self.send_method(0, m.ConnectionStart(server_properties={"product": "perf sink"}))
            while True:
                self.step()
        except (Closed, OSError, ConnectionException):
            pass  # The connection is over; the client sees why, the sink stays up.
        finally:
            self.sock.close()

    def read_protocol_header(self) -> None:
        while self.buffer.pending() < len(codec.PROTOCOL_HEADER_0_9_1):
            self.buffer.fill(self.sock)
        _version, used = codec.parse_protocol_header(self.buffer.view[self.buffer.start :])
        self.buffer.start += used

    def step(self) -> None:
        """Read what has arrived (waiting only when no consumer has room), answer it,
        then send one batch to each consumer with room."""
        sending = any(stream.room() > 0 for stream in self.streams.values())
        readable, _, _ = select.select([self.sock], [], [], 0.0 if sending else POLL_S)
        if readable:
            try:
                self.buffer.fill(self.sock)
            except PerfError:
                raise Closed from None
            self.handle_frames()
        for stream in self.streams.values():
            room = stream.room()
            if room > 0:
                self.out += stream.batch.take(room, stream.delivered + 1)
                stream.delivered += room
        self.flush()

    def handle_frames(self) -> None:
        scan = scan_publishes(self.buffer)
        for channel, count in scan.publishes.items():
            if channel in self.confirming:
                self.confirming[channel] += count
                tag = codec.DeliveryTag(self.confirming[channel])
                codec.append_basic_ack(self.out, codec.ChannelId(channel), tag, True)
        for channel, acked_upto in scan.acked_upto.items():
            stream = self.streams.get(channel)
            if stream is not None:
                # A null broker: the highest tag acked stands for every tag below it,
                # whether acked with `multiple` or one by one, in order.
                stream.acked = max(stream.acked, acked_upto)
        for frame in scan.others:
            self.on_method(frame.channel, codec.decode_method(frame.payload))

    def on_method(self, channel: int, method: m.Method) -> None:
        reply = self.reply_to(channel, method)
        if reply is not None:
            self.send_method(channel, reply)
        if isinstance(method, m.ConnectionCloseOk | m.ConnectionClose):
            self.flush()
            raise Closed

    def reply_to(self, channel: int, method: m.Method) -> m.Method | None:
        """The answer to `method`, after noting what it changes."""
        simple = _SIMPLE_REPLIES.get(type(method))
        if simple is not None:
            return simple
        if isinstance(method, m.ConnectionStartOk):
            return m.ConnectionTune(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)
        if isinstance(method, m.ChannelClose):
            self.forget(channel)
            return m.ChannelCloseOk()
        if isinstance(method, m.QueueDeclare):
            self.queues += 1
            return m.QueueDeclareOk(queue=method.queue or f"amq.gen-sink-{self.queues}")
        if isinstance(method, m.ConfirmSelect):
            self.confirming[channel] = 0
            return None if method.nowait else m.ConfirmSelectOk()
        if isinstance(method, m.BasicQos):
            self.prefetch[channel] = method.prefetch_count
            return m.BasicQosOk()
        if isinstance(method, m.BasicConsume):
            return self.subscribe(channel, method)
        if isinstance(method, m.BasicCancel):
            self.streams.pop(channel, None)
            return m.BasicCancelOk(consumer_tag=method.consumer_tag)
        if isinstance(method, m.ConnectionTuneOk | m.ConnectionCloseOk):
            return None
        text = f"the perf sink does not implement {method.NAME}"
        return m.ConnectionClose(_NOT_IMPLEMENTED, text, method.CLASS_ID, method.METHOD_ID)

    def subscribe(self, channel: int, method: m.BasicConsume) -> m.Method:
        tag = method.consumer_tag or f"amq.ctag-sink-{channel}"
        batch = DeliveryBatch(channel, tag, method.queue, self.body_bytes, FRAME_MAX)
        self.streams[channel] = Stream(batch, method.no_ack, self.prefetch.get(channel, 0))
        return m.BasicConsumeOk(consumer_tag=tag)

    def forget(self, channel: int) -> None:
        self.streams.pop(channel, None)
        self.confirming.pop(channel, None)
        self.prefetch.pop(channel, None)

    def send_method(self, channel: int, method: m.Method) -> None:
        codec.append_method_frame(self.out, codec.ChannelId(channel), method)
        if isinstance(method, m.ConnectionClose):
            self.flush()
            raise Closed

    def flush(self) -> None:
        if self.out:
            self.sock.sendall(self.out)
            self.out.clear()


_SIMPLE_REPLIES: Final[dict[type[m.Method], m.Method]] = {
    m.ConnectionOpen: m.ConnectionOpenOk(),
    m.ConnectionClose: m.ConnectionCloseOk(),
    m.ChannelOpen: m.ChannelOpenOk(),
    m.ExchangeDeclare: m.ExchangeDeclareOk(),
    m.ExchangeDelete: m.ExchangeDeleteOk(),
    m.QueueBind: m.QueueBindOk(),
    m.QueueUnbind: m.QueueUnbindOk(),
    m.QueuePurge: m.QueuePurgeOk(),
    m.QueueDelete: m.QueueDeleteOk(),
    m.TxSelect: m.TxSelectOk(),
    m.TxCommit: m.TxCommitOk(),
    m.TxRollback: m.TxRollbackOk(),
}


class _Handler(socketserver.BaseRequestHandler):
    server: SinkServer

    def handle(self) -> None:
        SinkConnection(self.request, self.server.body_bytes).run()


class SinkServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], body_bytes: int) -> None:
        self.body_bytes = body_bytes
        super().__init__(address, _Handler)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_sink(bind: str, port: int, body_bytes: int) -> int:
    """Serve until SIGINT or SIGTERM. Raises `PerfError` when the port cannot be bound."""
    try:
        server = SinkServer((bind, port), body_bytes)
    except OSError as exc:
        raise PerfError(f"cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    signal.signal(signal.SIGTERM, _terminate)
    host, bound_port = server.server_address[:2]
    print(f"streamq perf sink: listening on {host!s}:{bound_port}", flush=True)
    try:
        server.serve_forever(poll_interval=POLL_S)
    except KeyboardInterrupt:
        print("streamq perf sink: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
