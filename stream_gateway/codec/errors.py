"""The codec's one error family: every refusal of input bytes is a `StreamCodecError`.

Each error carries the stream protocol `response_code` that the connection closes with, so
the gateway maps codec errors to a Close frame in one place. Encoders refuse values the wire
cannot carry with `ValueError` (a programmer error, not a peer's).
"""

from __future__ import annotations

from stream_gateway.codec.constants import ResponseCode


class StreamCodecError(Exception):
    """Bytes from the peer that are not a valid stream protocol frame."""

    response_code: ResponseCode = ResponseCode.UNKNOWN_FRAME


class MalformedFrame(StreamCodecError):
    """A frame that is truncated, too long for its fields, or has a field out of range.

    RabbitMQ has no dedicated code for this and closes with UNKNOWN_FRAME, as we do.
    """


class UnknownFrame(StreamCodecError):
    """A key or key/version pair this codec does not decode."""


class FrameTooLarge(StreamCodecError):
    """A frame whose size header exceeds the negotiated frame_max."""

    response_code = ResponseCode.FRAME_TOO_LARGE
