"""A lean stream-protocol client for the benchmarks, so the broker is measured, not the client.

Owns one connection to a broker's stream port (RabbitMQ's binary protocol, 5552): the
handshake and every control command go through our codec (`stream_gateway.codec`), the
two hot paths do not. Publishing sends Publish frames of `batch` messages built once and
patched with their publishing ids, with at most `window` messages unconfirmed (as the
Java and Go clients do); PublishConfirm frames are counted from their header. Consuming
subscribes from first with credit and counts records from each Deliver's chunk header
(`num_records`), granting one credit back per chunk as real clients do; the records
themselves are never decoded. rstream, the Python client, is an order of magnitude
slower than either broker, which is why this exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Final

from stream_gateway.codec import commands as c
from stream_gateway.codec import decode, encode
from stream_gateway.codec.constants import Key, OffsetType, ResponseCode

_SIZE: Final = struct.Struct(">I")
_KEY_VERSION: Final = struct.Struct(">HH")
_ID: Final = struct.Struct(">Q")
_COUNT: Final = struct.Struct(">I")
_CREDIT_ONE: Final = struct.Struct(">IHHBH")  # size, key, version, subscription id, credit
_PUBLISH_HEADER: Final = struct.Struct(">IHHBI")  # size, key, version, publisher id, count
# Where a field sits from the start of a frame (size field included).
_CONFIRM_COUNT_AT: Final = 4 + 4 + 1  # after size, key/version, publisher id
_DELIVER_RECORDS_AT: Final = {1: 4 + 4 + 1 + 4, 2: 4 + 4 + 1 + 8 + 4}
"""num_records in a Deliver: after the subscription id (v2: and the committed offset),
the chunk's magic/version, type and num_entries."""
REQUEST_TIMEOUT_S: Final = 30.0
PUBLISHER_ID: Final = 1
SUBSCRIPTION_ID: Final = 1


class StreamProtocolError(Exception):
    """The broker refused a command or closed the connection."""


def amqp10_data(body: bytes) -> bytes:
    """`body` as an AMQP 1.0 message of one data section, as stream clients send it:
    descriptor 0x75 (data), then binary8 or binary32."""
    if len(body) < 256:
        return b"\x00\x53\x75\xa0" + bytes([len(body)]) + body
    return b"\x00\x53\x75\xb0" + _COUNT.pack(len(body)) + body


def publish_frame(message: bytes, batch: int) -> tuple[bytearray, list[int]]:
    """A Publish (v1) frame of `batch` copies of `message` from publisher PUBLISHER_ID, and
    where each publishing id goes in it."""
    entry = bytes(8) + _COUNT.pack(len(message)) + message
    body_bytes = 4 + 1 + 4 + batch * len(entry)
    frame = bytearray(_PUBLISH_HEADER.pack(body_bytes, Key.PUBLISH, 1, PUBLISHER_ID, batch))
    header = len(frame)
    frame += entry * batch
    return frame, [header + n * len(entry) for n in range(batch)]


class StreamClient(asyncio.Protocol):
    """One connection; `connect` opens it, then `publish` and `consume` run the loads."""

    def __init__(self) -> None:
        self.transport: asyncio.WriteTransport | None = None
        self._buffer = bytearray()
        self._skip = 0  # bytes of a Deliver frame still to come, not to be read
        self._correlation = 0
        self._waiting: dict[int, asyncio.Future[c.Command]] = {}
        self._tune: asyncio.Future[c.Tune] | None = None
        self._progress = asyncio.Event()
        self._closed: str | None = None
        self.confirmed = 0
        self.records = 0
        self.chunks = 0

    @classmethod
    async def connect(
        cls, host: str, port: int, user: str = "guest", password: str = "guest", vhost: str = "/"
    ) -> StreamClient:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(cls, host, port)
        await client._handshake(user, password, vhost)
        return client

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport writes

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = f"connection lost: {exc}"
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(StreamProtocolError(self._closed))
        self._progress.set()

    def data_received(self, data: bytes) -> None:
        """Frames are parsed where they lie: a Deliver's records are counted from its
        header and the rest of the frame skipped unread, so a consumer copies no chunk."""
        start = 0
        if self._skip:
            start = min(self._skip, len(data))
            self._skip -= start
        if self._buffer:
            self._buffer += memoryview(data)[start:]
            source: bytes | bytearray = self._buffer
            start = 0
        else:
            source = data
        position = self._parse(source, start)
        self._buffer = bytearray(source[position:]) if position < len(source) else bytearray()
        self._progress.set()

    def _parse(self, source: bytes | bytearray, position: int) -> int:
        """Handle the frames in `source` from `position`; where the unhandled rest starts."""
        end, credits = len(source), 0
        while end - position >= 8:
            (size,) = _SIZE.unpack_from(source, position)
            key, version = _KEY_VERSION.unpack_from(source, position + 4)
            frame_end = position + 4 + size
            if key == Key.DELIVER:
                at = position + _DELIVER_RECORDS_AT[version]
                if at + 4 > end:
                    break
                self.records += _COUNT.unpack_from(source, at)[0]
                self.chunks += 1
                credits += 1
                if frame_end > end:
                    self._skip = frame_end - end
                    position = end
                    break
            elif frame_end > end:
                break
            elif key == Key.PUBLISH_CONFIRM:
                self.confirmed += _COUNT.unpack_from(source, position + _CONFIRM_COUNT_AT)[0]
            else:
                self._control(bytes(source[position + 4 : frame_end]))
            position = frame_end
        if credits:
            self._grant(credits)
        return position

    # -- control commands through the codec -------------------------------------------
    def _control(self, frame: bytes) -> None:
        command = decode(frame)
        if isinstance(command, c.Tune) and self._tune is not None:
            self._tune.set_result(command)
        elif isinstance(command, c.Close):
            self._closed = f"closed by the broker: {command.reason}"
            self._send(c.Response(Key.CLOSE, command.correlation_id, ResponseCode.OK))
        elif isinstance(command, c.PublishError):
            self._closed = f"publish error: {command.errors[:3]}"
        correlation = getattr(command, "correlation_id", None)
        future = self._waiting.pop(correlation, None) if correlation is not None else None
        if future is not None and not future.done():
            future.set_result(command)

    def _send(self, command: c.Command) -> None:
        assert self.transport is not None
        self.transport.write(encode(command))

    def next_correlation(self) -> int:
        self._correlation += 1
        return self._correlation

    async def request(
        self, command: c.Command, ok: tuple[int, ...] = (ResponseCode.OK,)
    ) -> c.Command:
        """Send a command with a correlation id and wait for its response; raises
        StreamProtocolError unless its code is in `ok`."""
        future: asyncio.Future[c.Command] = asyncio.get_running_loop().create_future()
        self._waiting[command.correlation_id] = future  # type: ignore[attr-defined]
        self._send(command)
        response = await asyncio.wait_for(future, REQUEST_TIMEOUT_S)
        code = getattr(response, "response_code", ResponseCode.OK)
        if code not in ok:
            raise StreamProtocolError(f"{type(command).__name__}: response code {code}")
        return response

    async def _handshake(self, user: str, password: str, vhost: str) -> None:
        await self.request(c.PeerProperties(self.next_correlation(), {"product": "stream-bench"}))
        await self.request(c.SaslHandshake(self.next_correlation()))
        self._tune = asyncio.get_running_loop().create_future()
        plain = b"\0" + user.encode() + b"\0" + password.encode()
        await self.request(c.SaslAuthenticate(self.next_correlation(), "PLAIN", plain))
        tune = await asyncio.wait_for(self._tune, REQUEST_TIMEOUT_S)
        self.frame_max = tune.frame_max
        self._send(c.Tune(tune.frame_max, tune.heartbeat_s))  # rstream answers with key 0x14
        await self.request(c.Open(self.next_correlation(), vhost))

    async def create(self, stream: str) -> None:
        already = (ResponseCode.OK, ResponseCode.STREAM_ALREADY_EXISTS)
        await self.request(c.Create(self.next_correlation(), stream, {}), already)

    async def delete(self, stream: str) -> None:
        await self.request(c.Delete(self.next_correlation(), stream))

    async def close(self) -> None:
        if self.transport is not None and self._closed is None:
            with contextlib.suppress(StreamProtocolError, TimeoutError):
                await self.request(c.Close(self.next_correlation(), ResponseCode.OK, "done"))
            self.transport.close()

    # -- the loads ----------------------------------------------------------------------
    async def publish(
        self, stream: str, message: bytes, count: int, batch: int, window: int
    ) -> None:
        """Publish `count` copies of `message` (a multiple of `batch`), at most `window`
        unconfirmed; returns once all are confirmed."""
        await self.request(c.DeclarePublisher(self.next_correlation(), PUBLISHER_ID, "", stream))
        frame, id_positions = publish_frame(message, batch)
        if len(frame) > self.frame_max:
            raise StreamProtocolError(f"a batch of {len(frame)} B exceeds frame_max")
        assert self.transport is not None
        base = self.confirmed
        sent = 0
        while sent < count:
            while sent - (self.confirmed - base) + batch > window:
                await self._wait_progress()
            for n, position in enumerate(id_positions, sent + 1):
                _ID.pack_into(frame, position, n)
            self.transport.write(bytes(frame))
            sent += batch
        while self.confirmed - base < count:
            await self._wait_progress()
        await self.request(c.DeletePublisher(self.next_correlation(), PUBLISHER_ID))

    async def consume(self, stream: str, count: int, credit: int) -> None:
        """Subscribe to `stream` from first with `credit` and return once `count` records
        came (counted from the chunk headers)."""
        base = self.records
        first = c.OffsetSpec(OffsetType.FIRST)
        subscribe = c.Subscribe(self.next_correlation(), SUBSCRIPTION_ID, stream, first, credit)
        await self.request(subscribe)
        while self.records - base < count:
            await self._wait_progress()
        await self.request(c.Unsubscribe(self.next_correlation(), SUBSCRIPTION_ID))

    def _grant(self, credits: int) -> None:
        assert self.transport is not None
        frame = _CREDIT_ONE.pack(7, Key.CREDIT, 1, SUBSCRIPTION_ID, credits)
        self.transport.write(frame)

    async def _wait_progress(self) -> None:
        if self._closed is not None:
            raise StreamProtocolError(self._closed)
        self._progress.clear()
        await asyncio.wait_for(self._progress.wait(), REQUEST_TIMEOUT_S)
