"""Fuzz MQTT over WebSocket (http_gateway/websocket_api.py's upgrade on `/mqtt`,
mqtt_gateway/websocket.py, streamq/websocket_transport.py), with the MQTT session of a
real broker behind it (tests/fuzz/broker_host.py), over a real loopback socket to
aiohttp's in-process server.

An input is the MQTT codec's (`level | split | bytes`, corpus/mqtt: what paho-mqtt and
MQTT.js send): the bytes are MQTT, cut into masked binary frames of `split` bytes (0:
one frame), so the session is fuzzed through the WebSocket, packets spanning frames and
several in one; a `level` of 3 mod 4 sends the bytes unframed instead (the framing's
own refusals). A close frame and the end of the stream follow.

The property, as AMQP over WebSocket's (test_websocket.py): the upgrade is answered with
101; nothing is logged with a traceback; once the client has sent its close frame and
hung up, the server closes the socket within CLOSE_WAIT_S.

Run: pytest tests/fuzz/test_mqtt_websocket.py (bounded), or
python -m tests.fuzz.soak mqtt_websocket -runs=100000 (atheris soak).
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp.test_utils import TestServer

from amqp_gateway.gateway import Gateway
from amqp_gateway.tuning import FRAME_MAX, MESSAGE_BYTES_MAX
from amqp_gateway.websocket import AmqpOverWebSocket, message_bytes_max
from http_gateway.server import build_app
from mqtt_gateway.codec import Connect, ProtocolLevel, encode
from mqtt_gateway.server import MqttGateway
from mqtt_gateway.websocket import MqttOverWebSocket
from streamq.broker.broker import Broker
from tests.fuzz.broker_host import BrokerHost
from tests.fuzz.harness import bounded_run
from tests.fuzz.websocket_client import converse, frame

CORPUS: Final = "mqtt"
EXAMPLES: Final = 600
INPUTS_PER_BROKER: Final = 3000
PACKET_BYTES_MAX: Final = 4096  # small: the fuzzer reaches the limits
UPGRADE: Final = (
    b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: mqtt\r\n\r\n"
)


def binary_frames(data: bytes, split: int) -> bytes:
    size = split or max(len(data), 1)
    return b"".join(frame(0x2, data[i : i + size]) for i in range(0, len(data), size))


class Site:
    """The broker host and its HTTP server with MQTT over WebSocket (renewed with it)."""

    def __init__(self) -> None:
        self.host = BrokerHost(INPUTS_PER_BROKER)
        self.server = self.host.run(self._server(self.host.broker))
        self.host.on_new_broker.append(self._replace)

    async def _server(self, broker: Broker) -> TestServer:
        self.gateway = Gateway(broker)
        self.gateway.attach(asyncio.get_running_loop())
        self.mqtt = MqttGateway(broker, packet_bytes_max=PACKET_BYTES_MAX)
        self.mqtt.attach(asyncio.get_running_loop())
        amqp = AmqpOverWebSocket(
            self.gateway.protocol_factory, message_bytes_max(MESSAGE_BYTES_MAX, FRAME_MAX)
        )
        server = TestServer(build_app(broker, amqp, MqttOverWebSocket(self.mqtt)))
        await server.start_server()
        return server

    def _replace(self, broker: Broker) -> None:
        self.mqtt.close_all("fuzz: next broker")
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
    if len(data) < 2:
        return
    level, split, body = data[0], data[1], data[2:]
    sent = body if level % 4 == 3 else binary_frames(body, split)
    web = site()
    web.host.next_input()
    answer = web.host.run(web.converse(sent))
    assert answer.startswith(b"HTTP/1.1 101"), answer[:200]
    errors = web.host.logged_errors()
    assert not errors, "\n".join(errors)


def test_mqtt_websocket_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)


def test_a_connect_split_over_frames_is_answered() -> None:
    level = ProtocolLevel.MQTT_3_1_1
    connect = encode(Connect(level, "fuzz", username="guest", password=b"guest"), level)
    web = site()
    answer = web.host.run(web.converse(binary_frames(connect, 3)))
    assert b"\x82\x04\x20\x02\x00\x00" in answer  # CONNACK 0 in one binary frame
