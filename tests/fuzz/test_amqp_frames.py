"""Fuzz the AMQP 0-9-1 connection state machine (amqp_gateway/connection.py) sans-IO, in
every connection state: the protocol header, start-ok, tune-ok, open, then channel
methods, content headers and bodies, heartbeats and the close handshakes.

An input is `state | split | bytes`: `state` (mod 5) says how far a well-behaved client
got before the fuzzed bytes (nothing; header; start-ok accepted; tune-ok; open with
channel 1), `split` how the bytes arrive (all at once, one byte at a time, in chunks of
`split` bytes, or through `read_buffer`/`receive_read`, the server's zero-copy path
that runs the C scanners of amqp_gateway/codec/_scan.c). The server side answers a
login and an open at once and handles every event before parsing goes on (rule 3).

The property: `receive_data` and `receive_read` never raise (a protocol error is a
close in `outgoing`); a close carries a reply code the spec allows; the receive buffer
holds at most one partial frame of the negotiated frame_max unless parsing is paused
(rule 3), and then no more than the input; what the server sends always splits into
whole frames that decode, and
each close it sends carries one of the spec's reply codes.

Run: pytest tests/fuzz/test_amqp_frames.py (bounded), or
python -m tests.fuzz.soak amqp_frames -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.frame import FRAME_HEADER_BYTES, FRAME_OVERHEAD_BYTES
from amqp_gateway.connection import CHANNEL_MAX, FRAME_MAX, Connection
from amqp_gateway.errors import ReplyCode
from amqp_gateway.events import Event, LoginRequested, OpenRequested
from amqp_gateway.states import State
from tests.fuzz.harness import bounded_run

CORPUS: Final = "amqp"
EXAMPLES: Final = 6000
SHARED_READ_BYTES: Final = 64 * 1024  # as the server's shared read buffer
HEADER: Final = b"AMQP\x00\x00\x09\x01"
STATES: Final = 5
BYTEWISE_BYTES_MAX: Final = 600  # past the handshake and a publish or two
_REPLY_CODES: Final = frozenset(int(code) for code in ReplyCode)
_CLOSES: Final = (b"\x00\x0a\x00\x32", b"\x00\x14\x00\x28")  # connection.close, channel.close


def handshake(state: int) -> bytes:
    """What a well-behaved client sends to reach handshake step `state` (0-4)."""
    steps = [
        HEADER,
        codec.encode_method_frame(
            codec.ChannelId(0),
            m.ConnectionStartOk({"product": "fuzz"}, "PLAIN", b"\x00guest\x00guest"),
        ),
        codec.encode_method_frame(
            codec.ChannelId(0), m.ConnectionTuneOk(CHANNEL_MAX, FRAME_MAX, 0)
        ),
        codec.encode_method_frame(codec.ChannelId(0), m.ConnectionOpen(virtual_host="/"))
        + codec.encode_method_frame(codec.ChannelId(1), m.ChannelOpen()),
    ]
    return b"".join(steps[:state])


_PREFIXES: Final = [handshake(state) for state in range(STATES)]


class Server:
    """The connection and the least of a server around it: logins and opens accepted,
    events handled at once."""

    def __init__(self) -> None:
        self.connection = Connection({"product": "streamq"}, now_s=0.0)
        self.sent = bytearray()
        self.largest_input = 0

    def handle(self, events: list[Event]) -> None:
        connection = self.connection
        while True:
            for event in events:
                if isinstance(event, LoginRequested) and connection.state is State.AWAIT_START_OK:
                    connection.accept_login(event.username)
                elif isinstance(event, OpenRequested) and connection.state is State.AWAIT_OPEN:
                    connection.accept_open(event.virtual_host)
            if not connection.parse_paused:
                break
            events = connection.resume_parse()
        self.sent += connection.take_outgoing(0.0)
        self.check_buffer()

    def check_buffer(self) -> None:
        connection = self.connection
        held = len(connection._buffer)  # the limit under test
        if connection.state is State.CLOSED:
            # Nothing is parsed or appended any more; what the last read left stays
            # (after a partial protocol header, in front of it).
            assert held <= len(HEADER) + self.largest_input, (held, self.largest_input)
        elif connection.parse_paused:
            assert held <= self.largest_input + FRAME_MAX, (held, self.largest_input)
        elif connection.state is State.AWAIT_HEADER:
            assert held < len(HEADER), held
        else:
            # One partial frame: its header and at most frame_max of payload and end.
            assert held <= FRAME_HEADER_BYTES + connection.frame_max + 1, (
                held,
                connection.frame_max,
            )

    def feed(self, data: bytes) -> None:
        self.largest_input = max(self.largest_input, len(data))
        self.handle(self.connection.receive_data(data, 0.0))

    def feed_read(self, data: bytes) -> None:
        """The server's zero-copy path: the read lands in a shared buffer."""
        self.largest_input = max(self.largest_input, len(data))
        shared = bytearray(SHARED_READ_BYTES)
        view = self.connection.read_buffer(shared, max(len(data), 1))
        view[: len(data)] = data
        view.release()
        self.handle(self.connection.receive_read(len(data), 0.0))

    def check_sent(self) -> None:
        """Everything sent splits into whole frames whose methods decode."""
        sent = bytes(self.sent)
        if sent.startswith(b"AMQP"):  # a refused protocol header is answered with ours
            assert sent == HEADER, sent
            return
        frames, used = codec.split_frames(sent, FRAME_MAX + FRAME_OVERHEAD_BYTES)
        assert used == len(sent), (used, len(sent))
        for frame in frames:
            if frame.frame_type != codec.FRAME_METHOD:
                continue
            if frame.payload[:4] in _CLOSES:
                # Reply texts quote the peer's octets raw, as RabbitMQ's do (not always
                # UTF-8: errors.reply_text): only the code is checked.
                assert int.from_bytes(frame.payload[4:6]) in _REPLY_CODES, frame
            else:
                codec.decode_method(frame.payload)


def fuzz_one(data: bytes) -> None:
    if len(data) < 2:
        return
    state, split, body = data[0] % STATES, data[1], data[2:]
    server = Server()
    prefix = _PREFIXES[state]
    if prefix:
        server.feed(prefix)
    if split == 0:
        server.feed(body)
    elif split == 1:
        # Byte by byte costs a call per byte: the first BYTEWISE_BYTES_MAX go so.
        for i in range(min(len(body), BYTEWISE_BYTES_MAX)):
            server.feed(body[i : i + 1])
        server.feed(body[BYTEWISE_BYTES_MAX:])
    elif split < 128:
        for i in range(0, len(body), split):
            server.feed(body[i : i + split])
    else:
        chunk = split - 127
        for i in range(0, len(body), chunk):
            if server.connection.state is State.CLOSED:
                break
            server.feed_read(body[i : i + chunk])
    server.check_sent()


def test_amqp_frames_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)


def test_the_handshake_prefixes_reach_their_states() -> None:
    for state, expected in enumerate(
        [
            State.AWAIT_HEADER,
            State.AWAIT_START_OK,
            State.AWAIT_TUNE_OK,
            State.AWAIT_OPEN,
            State.OPEN,
        ]
    ):
        server = Server()
        server.feed(_PREFIXES[state])
        assert server.connection.state is expected
    assert server.connection.is_channel_open(1)
