"""The sans-IO codec of RabbitMQ's stream protocol: bytes <-> typed commands.

No sockets, asyncio, clock or global mutable state. Modules, by what they own:
`constants` (keys, versions, response codes, offset types), `errors` (the one error
family), `wire` (primitive types), `commands` (dataclasses), `bodies` (body decoders),
`encoders` (body encoders) and `frames` (envelope: `split_frames`, `decode`, `encode`).
"""

from __future__ import annotations

from stream_gateway.codec.errors import (
    FrameTooLarge,
    MalformedFrame,
    StreamCodecError,
    UnknownFrame,
)
from stream_gateway.codec.frames import check_frame_size, decode, encode, split_frames

__all__ = [
    "FrameTooLarge",
    "MalformedFrame",
    "StreamCodecError",
    "UnknownFrame",
    "check_frame_size",
    "decode",
    "encode",
    "split_frames",
]
