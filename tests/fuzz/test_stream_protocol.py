"""Fuzz the stream protocol (stream_gateway: the codec, the dispatch table and every
command's handler) in each connection state, against a real broker
(tests/fuzz/broker_host.py).

An input is `state | split | bytes`. `state` (mod 6) says how far a well-behaved client
got first: nothing, PeerProperties, SaslHandshake, SaslAuthenticate (guest), Tune, Open
("/"); `split` how the bytes arrive (0: one read, else reads of `split` bytes). The
bytes go to a StreamSession over an in-memory transport (the socket is the only part
not real: asyncio hands `data_received` the same bytes), whose writes are kept; the
session is then dropped as a lost connection.

The property: no internal error (the session logs one with its traceback and closes
with INTERNAL_ERROR: `BrokerHost.logged_errors`), nothing raised out of
`data_received`, the receive buffer never holds more than one frame of the negotiated
frame_max, and what the server wrote splits into whole frames.

Run: pytest tests/fuzz/test_stream_protocol.py (bounded), or
python -m tests.fuzz.soak stream_protocol -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

import asyncio
from typing import Final

from stream_gateway.codec import commands as c
from stream_gateway.codec import encode, split_frames
from stream_gateway.server import StreamGateway
from stream_gateway.session import State, StreamSession
from streamq.broker.broker import Broker
from tests.fuzz.broker_host import BrokerHost
from tests.fuzz.harness import bounded_run

CORPUS: Final = "stream"
EXAMPLES: Final = 3200
INPUTS_PER_BROKER: Final = 2000
STATES: Final = 6
FRAME_MAX: Final = 1 << 20
SIZE_BYTES: Final = 4  # each frame's length prefix
PEER: Final = ("127.0.0.1", 50000)
OWN: Final = ("127.0.0.1", 5552)

_HANDSHAKE: Final = [
    c.PeerProperties(1, {"product": "fuzz"}),
    c.SaslHandshake(2),
    c.SaslAuthenticate(3, "PLAIN", b"\x00guest\x00guest"),
    c.Tune(FRAME_MAX, 0),
    c.Open(4, "/"),
]
PREFIXES: Final = [b"".join(encode(command) for command in _HANDSHAKE[:n]) for n in range(STATES)]


class MemoryTransport(asyncio.Transport):
    """What a session writes, kept; closing marks it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": PEER, "sockname": OWN}.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Streams:
    """The broker host and its stream gateway (a new one with each new broker)."""

    def __init__(self) -> None:
        self.host = BrokerHost(INPUTS_PER_BROKER)
        self.gateway = self._gateway(self.host.broker)
        self.host.on_new_broker.append(self._replace)

    def _gateway(self, broker: Broker) -> StreamGateway:
        gateway = StreamGateway(broker, frame_max=FRAME_MAX)
        gateway.attach(self.host.loop)
        return gateway

    def _replace(self, broker: Broker) -> None:
        timer = self.gateway._alarm_timer  # the old gateway's only timer
        if timer is not None:
            timer.cancel()
        self.gateway = self._gateway(broker)


_streams: Streams | None = None


def streams() -> Streams:
    global _streams  # noqa: PLW0603 - one broker for the whole run, opened on first use
    if _streams is None:
        _streams = Streams()
    return _streams


async def converse(gateway: StreamGateway, reads: list[bytes]) -> bytes:
    session = StreamSession(gateway)
    transport = MemoryTransport()
    session.connection_made(transport)
    try:
        for data in reads:
            if transport.closed or session.state is State.CLOSED:
                break
            session.data_received(data)
            if session.state not in (State.CLOSING, State.CLOSED):
                held = len(session._buffer)  # the limit under test
                assert held < SIZE_BYTES + session.frame_max, (held, session.frame_max)
        await asyncio.sleep(0)  # deliveries and confirms scheduled by the reads
    finally:
        session.connection_lost(None)
    return bytes(transport.written)


def fuzz_one(data: bytes) -> None:
    if len(data) < 2:
        return
    state, split, body = data[0] % STATES, data[1], data[2:]
    host = streams()
    host.host.next_input()
    reads = [PREFIXES[state]] if state else []
    if split == 0:
        reads.append(body)
    else:
        reads += [body[i : i + split] for i in range(0, len(body), split)]
    written = host.host.run(converse(host.gateway, reads))
    assert not host.host.logged_errors()
    _frames, used = split_frames(written, 1 << 30)
    assert used == len(written), (used, len(written))


def test_stream_protocol_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)


def test_the_handshake_prefixes_open_the_connection() -> None:
    host = streams()
    written = host.host.run(converse(host.gateway, [PREFIXES[STATES - 1]]))
    frames, _used = split_frames(written, 1 << 30)
    assert len(frames) == 5  # the responses to the five requests, Tune included
