"""A raw AMQP client over a WebSocket for the tests that need frames in exact messages:
aiohttp's WebSocket client, frames built and read by pamqp (the test oracle), never the
broker's own codec."""

from __future__ import annotations

import asyncio

import aiohttp
from pamqp import body, commands, frame, header
from pamqp.base import Frame
from pamqp.exceptions import UnmarshalingException

TIMEOUT_S = 10
FRAME_MAX = 131072


def method(value: Frame, channel: int = 0) -> bytes:
    return frame.marshal(value, channel)


def publish(channel: int, routing_key: str, payload: bytes) -> bytes:
    """basic.publish to the default exchange: method, header and body frames."""
    return (
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key), channel)
        + frame.marshal(header.ContentHeader(0, len(payload), commands.Basic.Properties()), channel)
        + frame.marshal(body.ContentBody(payload), channel)
    )


class RawAmqp:
    """One AMQP connection over `ws`; `expect` reads frames in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._buffer = b""

    async def send(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def next_frame(self) -> tuple[int, object]:
        """(channel, pamqp frame) of the next frame; raises ConnectionError if the socket
        closes first."""
        while True:
            if self._buffer:
                try:
                    used, channel, value = frame.unmarshal(self._buffer)
                except UnmarshalingException:
                    pass  # a partial frame: read on
                else:
                    self._buffer = self._buffer[used:]
                    return channel, value
            msg = await asyncio.wait_for(self.ws.receive(), TIMEOUT_S)
            if msg.type is not aiohttp.WSMsgType.BINARY:
                raise ConnectionError(f"socket closed: {msg.type} {self.ws.close_code}")
            self._buffer += msg.data

    async def expect(self, kind: type) -> object:
        """The next frame, which must be a `kind`; connection.blocked and unblocked are
        skipped unless asked for."""
        skipped = (commands.Connection.Blocked, commands.Connection.Unblocked)
        while True:
            _, value = await self.next_frame()
            if kind in skipped or not isinstance(value, skipped):
                break
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
        return value

    async def handshake(
        self,
        heartbeat_s: int = 0,
        split: bool = False,
        user: str = "guest",
        password: str = "guest",
    ) -> None:
        """Up to connection.open-ok; `split`: every byte the client sends in a message of
        its own."""
        await self.log_in(user, password, split)
        await self.expect(commands.Connection.Tune)
        tune_ok = commands.Connection.TuneOk(2047, FRAME_MAX, heartbeat_s)
        opening = method(tune_ok) + method(commands.Connection.Open("/"))
        await self._send_maybe_split(opening, split)
        await self.expect(commands.Connection.OpenOk)

    async def log_in(self, user: str, password: str, split: bool = False) -> None:
        """The protocol header and start-ok (PLAIN); what the broker answers is the
        caller's to read (tune, or connection.close when the login is refused)."""
        await self._send_maybe_split(header.ProtocolHeader().marshal(), split)
        await self.expect(commands.Connection.Start)
        start_ok = commands.Connection.StartOk(
            client_properties={
                "product": "ws-test",
                "capabilities": {"connection.blocked": True, "authentication_failure_close": True},
            },
            response=f"\0{user}\0{password}",
        )
        await self._send_maybe_split(method(start_ok), split)

    async def _send_maybe_split(self, data: bytes, split: bool) -> None:
        if not split:
            await self.send(data)
            return
        for index in range(len(data)):
            await self.send(data[index : index + 1])
