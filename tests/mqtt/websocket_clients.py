"""Clients of MQTT over WebSocket for the tests: paho-mqtt switched to its "websockets"
transport, and a raw aiohttp WebSocket speaking through our own codec, for what paho
will not do (packets split across messages, several in one, text, oversized messages)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from mqtt_gateway.codec import Decoder, Packet, ProtocolLevel
from tests.mqtt.clients import WAIT_S, Paho

MQTT_PATH: Final = "/mqtt"


def ws_paho(
    port: int,
    client_id: str,
    *,
    path: str = MQTT_PATH,
    tls: ssl.SSLContext | None = None,
    **settings: Any,
) -> Paho:
    """A `Paho` over WebSocket (paho offers the subprotocol "mqtt"); with `tls`, wss."""
    client = Paho(port, client_id, **settings)
    client.client.transport = "websockets"
    client.client.ws_set_options(path=path)
    if tls is not None:
        client.client.tls_set_context(tls)
        client.client.tls_insecure_set(True)  # 127.0.0.1 is not the certificate's name
    return client


@dataclass
class RawResult:
    status: int | None = None  # the HTTP status of a refused upgrade
    protocol: str | None = None  # the subprotocol the server chose
    packets: list[Packet] = field(default_factory=list)
    close_code: int | None = None  # the server's close code, once it closed


async def _exchange(
    url: str,
    messages: Sequence[bytes | str],
    want: int,
    protocols: Sequence[str],
    headers: dict[str, str] | None,
    level: ProtocolLevel,
    wait_close: bool,
) -> RawResult:
    result = RawResult()
    decoder = Decoder(protocol_level=level)
    timeout = aiohttp.ClientWSTimeout(ws_close=WAIT_S)
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(
                url, protocols=tuple(protocols), headers=headers, timeout=timeout,
                max_msg_size=0,
            )  # fmt: skip
        except aiohttp.WSServerHandshakeError as exc:
            result.status = exc.status
            return result
        result.protocol = ws.protocol
        for message in messages:
            if isinstance(message, str):
                await ws.send_str(message)
            else:
                await ws.send_bytes(message)
        async with asyncio.timeout(WAIT_S):
            while len(result.packets) < want or wait_close:
                msg = await ws.receive()
                if msg.type is not aiohttp.WSMsgType.BINARY:
                    break
                result.packets.extend(decoder.feed(msg.data))
        if ws.closed or wait_close:
            result.close_code = ws.close_code
        await ws.close()
    return result


def raw_ws(
    url: str,
    messages: Sequence[bytes | str],
    *,
    want: int = 0,
    protocols: Sequence[str] = ("mqtt",),
    headers: dict[str, str] | None = None,
    level: ProtocolLevel = ProtocolLevel.MQTT_3_1_1,
    wait_close: bool = False,
) -> RawResult:
    """Send `messages` (bytes as binary, str as text) over a WebSocket to `url`; read
    `want` packets (or, with `wait_close`, until the server closes)."""
    return asyncio.run(_exchange(url, messages, want, protocols, headers, level, wait_close))
