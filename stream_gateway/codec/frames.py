"""Stream protocol framing: `uint32 size | uint16 key | uint16 version | body`.

This module owns the frame envelope: `split_frames` cuts whole frames out of a receive
buffer under a `frame_max` limit, `decode` turns one frame into a typed command and
`encode` does the reverse. Like the AMQP codec (STYLE.md section 2) it has no sockets,
clock or state; peer bytes are refused only with `StreamCodecError` subclasses:
`FrameTooLarge` as soon as a size header exceeds `frame_max` (before its body arrives),
`UnknownFrame` for keys and versions we do not speak, `MalformedFrame` for the rest.

`frame_max` counts the whole frame, its 4-byte size field included, as AMQP's frame_max
does; RabbitMQ's Tune leaves this open, and counting more is the safe side.
"""

from __future__ import annotations

import struct
from typing import Final

from stream_gateway.codec.bodies import DECODERS
from stream_gateway.codec.commands import Command, Deliver, Publish, Response
from stream_gateway.codec.constants import (
    COMMAND_VERSIONS_MAX,
    HEADER_BYTES,
    RESPONSE_FLAG,
    SIZE_BYTES,
    VERSION_1,
    Key,
)
from stream_gateway.codec.encoders import ENCODERS
from stream_gateway.codec.errors import FrameTooLarge, MalformedFrame, UnknownFrame
from stream_gateway.codec.wire import Reader, Writer

_SIZE: Final = struct.Struct(">I")
_HEADER: Final = struct.Struct(">HH")

FRAMES_PER_SPLIT_MAX: Final = 4096
"""At most this many frames come out of one `split_frames` call; the caller loops."""


def split_frames(buffer: bytes | bytearray | memoryview, frame_max: int) -> tuple[list[bytes], int]:
    """Cut the whole frames at the start of `buffer`; return them and the bytes consumed.

    Each returned frame is `key | version | body` (its size field stripped). A partial
    frame at the end stays in the buffer. Raises `FrameTooLarge` when a size header says
    more than `frame_max` (counted with the size field) and `MalformedFrame` when a size
    cannot even hold a key and version. Checks run on the header alone, so an oversized
    frame is refused before its body is buffered.
    """
    assert frame_max > SIZE_BYTES + HEADER_BYTES, frame_max
    view = memoryview(buffer)
    end = len(view)
    frames: list[bytes] = []
    position = 0
    # One loop over the whole read with unpack_from on a memoryview (STYLE.md section 11).
    while end - position >= SIZE_BYTES and len(frames) < FRAMES_PER_SPLIT_MAX:
        (size,) = _SIZE.unpack_from(view, position)
        check_frame_size(size, frame_max)
        frame_end = position + SIZE_BYTES + size
        if frame_end > end:
            break
        frames.append(bytes(view[position + SIZE_BYTES : frame_end]))
        position = frame_end
    return frames, position


def check_frame_size(size: int, frame_max: int) -> None:
    """Refuse a frame from its `size` header alone; see `split_frames`."""
    if size + SIZE_BYTES > frame_max:
        raise FrameTooLarge(f"frame of {size + SIZE_BYTES} bytes exceeds frame_max {frame_max}")
    if size < HEADER_BYTES:
        raise MalformedFrame(f"frame size {size} cannot hold a key and a version")


def decode(frame: bytes | bytearray | memoryview) -> Command:
    """Decode one frame without its size field (as `split_frames` returns it).

    Raises `UnknownFrame` for an unknown key or an unsupported version, `MalformedFrame`
    for a truncated body, trailing bytes, or a field out of range.
    """
    if len(frame) < HEADER_BYTES:
        raise MalformedFrame(f"frame of {len(frame)} bytes cannot hold a key and a version")
    key, version = _HEADER.unpack_from(frame, 0)
    decoder = DECODERS.get(key)
    if decoder is None:
        raise UnknownFrame(f"unknown command key 0x{key:04x}")
    version_max = COMMAND_VERSIONS_MAX.get(Key(key & ~RESPONSE_FLAG), VERSION_1)
    if not VERSION_1 <= version <= version_max:
        raise UnknownFrame(f"command key 0x{key:04x}: unsupported version {version}")
    reader = Reader(frame, HEADER_BYTES)
    command = decoder(reader, version)
    reader.expect_end(f"command key 0x{key:04x}")
    return command


def encode(command: Command, out: bytearray | None = None) -> bytes:
    """Encode one command as a whole frame, size field included.

    With `out`, the frame is also appended to it (one bytearray per socket write, STYLE.md
    section 11). Raises `ValueError` for a value the wire cannot carry (a string over
    32767 bytes, an integer out of its field's range).
    """
    wire_key, write_body = ENCODERS[type(command)]
    if isinstance(command, Response):
        wire_key = command.key | RESPONSE_FLAG
    version = command.version if isinstance(command, Publish | Deliver) else VERSION_1
    frame = bytearray(SIZE_BYTES)
    frame += _HEADER.pack(wire_key, version)
    try:
        write_body(Writer(frame), command)
    except struct.error as exc:
        raise ValueError(f"{type(command).__name__}: {exc}") from exc
    _SIZE.pack_into(frame, 0, len(frame) - SIZE_BYTES)
    if out is not None:
        out += frame
    return bytes(frame)
