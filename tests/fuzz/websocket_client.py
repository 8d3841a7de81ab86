"""The WebSocket client side the WebSocket fuzz modules share (test_websocket.py for AMQP,
test_mqtt_websocket.py for MQTT): masked client frames, and one conversation with the
server (upgrade, the input's bytes, a close frame, the end of the stream) that returns
what the server sent once it closed, which it must within CLOSE_WAIT_S."""

from __future__ import annotations

import asyncio
import struct
from typing import Final

from tests.fuzz.harness import scaled_s

CLOSE_WAIT_S: Final = scaled_s(3.0)
SERVER_TURNS: Final = 8  # loop turns for the server between the input and the close
MASK: Final = b"\x01\x02\x03\x04"
CLOSE_FRAME: Final = (
    b"\x88\x82" + MASK + bytes(a ^ b for a, b in zip(b"\x03\xe8", MASK[:2], strict=True))
)


def frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A masked client frame."""
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack(">H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", size)
    return head + MASK + bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))


async def converse(port: int, upgrade: bytes, data: bytes) -> bytes:
    """The `upgrade` request, `data`, a close frame and EOF; what the server sent, once
    it closed (it must within CLOSE_WAIT_S)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(upgrade)
        status = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_WAIT_S)
        try:
            writer.write(data)
            await writer.drain()
            for _ in range(SERVER_TURNS):  # the server reads and answers on this loop
                await asyncio.sleep(0)
            writer.write(CLOSE_FRAME)
            writer.write_eof()
        except OSError:
            pass  # the server closed or reset a broken stream before the client was done
        try:
            rest = await asyncio.wait_for(reader.read(), CLOSE_WAIT_S)
        except ConnectionResetError:
            rest = b""
        return status + rest
    finally:
        writer.close()
