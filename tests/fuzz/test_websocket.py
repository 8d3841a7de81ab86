"""Fuzz AMQP over WebSocket (http_gateway/websocket_api.py, amqp_gateway/websocket.py):
the WebSocket framing aiohttp parses, and what our transport makes of the messages,
with the AMQP session of a real broker behind it (tests/fuzz/broker_host.py), over a
real loopback socket to aiohttp's in-process server.

An input is `mode | bytes`. Mode 0: the bytes are what the client writes after its
upgrade request, WebSocket frames or not (unmasked, truncated, oversized...). Mode 1:
the bytes are AMQP, cut into masked binary frames by `frames` (each piece's length and
opcode taken from the input), so the AMQP session is fuzzed through the WebSocket. Either
way a close frame and the end of the stream follow.

The property: the server answers the upgrade with 101, never with 500; nothing is
logged with a traceback; and once the client has sent its close frame and hung up, the
server closes the socket within CLOSE_WAIT_S (no hang; the inbox is bounded by
INBOX_BYTES_MAX and aiohttp's max_msg_size, which the server sets from the message
limit).

Run: pytest tests/fuzz/test_websocket.py (bounded), or
python -m tests.fuzz.soak websocket -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp.test_utils import TestServer

from amqp_gateway.gateway import Gateway
from amqp_gateway.tuning import FRAME_MAX, MESSAGE_BYTES_MAX
from amqp_gateway.websocket import AmqpOverWebSocket, message_bytes_max
from http_gateway.server import build_app
from streamq.broker.broker import Broker
from tests.fuzz.broker_host import BrokerHost
from tests.fuzz.harness import bounded_run
from tests.fuzz.websocket_client import converse, frame

CORPUS: Final = "websocket"
EXAMPLES: Final = 1200
INPUTS_PER_BROKER: Final = 3000
OPCODES: Final = (0x2, 0x2, 0x2, 0x0, 0x1, 0x9, 0xA, 0x8)  # mostly binary
UPGRADE: Final = (
    b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: amqp\r\n\r\n"
)


def frames(data: bytes) -> bytes:
    """AMQP bytes as frames: each piece is `control | length | bytes`, the control byte
    naming the opcode (OPCODES, mostly binary) and whether the frame is final."""
    out = bytearray()
    position = 0
    while position + 2 <= len(data):
        control, size = data[position], data[position + 1]
        piece = data[position + 2 : position + 2 + size]
        position += 2 + size
        out += frame(OPCODES[control % len(OPCODES)], piece, fin=control < 0xF0)
    return bytes(out)


class Site:
    """The broker host and its HTTP server with AMQP over WebSocket (renewed with it)."""

    def __init__(self) -> None:
        self.host = BrokerHost(INPUTS_PER_BROKER)
        self.server = self.host.run(self._server(self.host.broker))
        self.host.on_new_broker.append(self._replace)

    async def _server(self, broker: Broker) -> TestServer:
        self.gateway = Gateway(broker)
        self.gateway.attach(asyncio.get_running_loop())
        websocket = AmqpOverWebSocket(
            self.gateway.protocol_factory, message_bytes_max(MESSAGE_BYTES_MAX, FRAME_MAX)
        )
        server = TestServer(build_app(broker, websocket))
        await server.start_server()
        return server

    def _replace(self, broker: Broker) -> None:
        self.gateway.stop()
        self.gateway.close_all("fuzz: next broker")
        self.host.run(self.server.close())
        self.server = self.host.run(self._server(broker))

    async def converse(self, data: bytes) -> bytes:
        assert self.server.port is not None
        return await converse(self.server.port, UPGRADE, data)


_site: Site | None = None


def site() -> Site:
    global _site  # noqa: PLW0603 - one broker for the whole run, opened on first use
    if _site is None:
        _site = Site()
    return _site


def fuzz_one(data: bytes) -> None:
    if not data:
        return
    sent = data[1:] if data[0] % 2 == 0 else frames(data[1:])
    web = site()
    web.host.next_input()
    answer = web.host.run(web.converse(sent))
    assert answer.startswith(b"HTTP/1.1 101"), answer[:200]
    errors = web.host.logged_errors()
    assert not errors, "\n".join(errors)


def test_websocket_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)


def test_an_amqp_handshake_over_the_websocket_is_answered() -> None:
    web = site()
    answer = web.host.run(web.converse(frame(2, b"AMQP\x00\x00\x09\x01")))
    assert b"PLAIN AMQPLAIN" in answer  # connection.start, in a binary frame
