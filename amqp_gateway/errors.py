"""AMQP 0-9-1 reply codes and the two typed exception families that carry them.

This module owns the mapping from an AMQP error condition to its reply code and to its
scope: a `ChannelException` (soft error, closes one channel) or a `ConnectionException`
(hard error, closes the connection). Every exception carries the `class_id` and
`method_id` of the offending method, 0 when no method is to blame (spec 1.4.2.5.1).

Rules:
1. Nothing here does I/O or turns an exception into a `Channel.Close` / `Connection.Close`
   frame; the protocol layer does that in one place (STYLE.md section 5).
2. Lower layers (log, queues, broker core) never import this module; they raise their own
   domain errors, which one gateway table maps onto these classes.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar, Final


class ReplyCode(IntEnum):
    """Every reply code of AMQP 0-9-1 (spec section 1.4.2.5, "constants")."""

    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


SOFT_REPLY_CODES: Final[frozenset[ReplyCode]] = frozenset(
    {
        ReplyCode.CONTENT_TOO_LARGE,
        ReplyCode.NO_ROUTE,
        ReplyCode.NO_CONSUMERS,
        ReplyCode.ACCESS_REFUSED,
        ReplyCode.NOT_FOUND,
        ReplyCode.RESOURCE_LOCKED,
        ReplyCode.PRECONDITION_FAILED,
    }
)
"""Codes the spec marks "soft-error": they close the channel, not the connection."""

HARD_REPLY_CODES: Final[frozenset[ReplyCode]] = (
    frozenset(code for code in ReplyCode if code is not ReplyCode.REPLY_SUCCESS) - SOFT_REPLY_CODES
)
"""Codes the spec marks "hard-error": they close the whole connection."""


class AMQPError(Exception):
    """An AMQP error condition with its reply code and the method that caused it.

    `reply_text` is a shortstr on the wire; the protocol layer truncates it to 255 bytes.
    """

    reply_code: ClassVar[ReplyCode]

    def __init__(self, reply_text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(reply_text)
        self.reply_text: str = reply_text
        self.class_id: int = class_id
        self.method_id: int = method_id

    def __str__(self) -> str:
        return (
            f"{self.reply_code.name} ({self.reply_code.value}): {self.reply_text}"
            f" [class_id={self.class_id}, method_id={self.method_id}]"
        )


class ChannelException(AMQPError):
    """A soft error: the channel is closed with `Channel.Close`, the connection lives on.

    A channel exception raised on channel 0 is escalated to a connection exception by the
    protocol layer (STYLE.md section 5).
    """


class ConnectionException(AMQPError):
    """A hard error: the connection is closed with `Connection.Close`."""


# Soft errors (channel exceptions).


class ContentTooLarge(ChannelException):
    reply_code = ReplyCode.CONTENT_TOO_LARGE


class NoRoute(ChannelException):
    reply_code = ReplyCode.NO_ROUTE


class NoConsumers(ChannelException):
    reply_code = ReplyCode.NO_CONSUMERS


class AccessRefused(ChannelException):
    reply_code = ReplyCode.ACCESS_REFUSED


class NotFound(ChannelException):
    reply_code = ReplyCode.NOT_FOUND


class ResourceLocked(ChannelException):
    reply_code = ReplyCode.RESOURCE_LOCKED


class PreconditionFailed(ChannelException):
    reply_code = ReplyCode.PRECONDITION_FAILED


# Hard errors (connection exceptions).


class ConnectionForced(ConnectionException):
    reply_code = ReplyCode.CONNECTION_FORCED


class InvalidPath(ConnectionException):
    reply_code = ReplyCode.INVALID_PATH


class FrameError(ConnectionException):
    """The peer sent a frame that cannot be split or decoded (bad size, end octet, type)."""

    reply_code = ReplyCode.FRAME_ERROR


class ProtocolHeaderMismatch(FrameError):
    """The peer opened with something other than a protocol header we speak.

    The spec (section 4.2.2) asks the server to answer with the protocol header it does
    support and then close the socket, without a `Connection.Close`; `supported_header`
    holds those 8 bytes.
    """

    def __init__(self, reply_text: str, received: bytes, supported_header: bytes) -> None:
        super().__init__(reply_text)
        self.received: bytes = received
        self.supported_header: bytes = supported_header


class AMQPSyntaxError(ConnectionException):
    """A well-framed method or header whose fields do not decode (named to not shadow
    the builtin `SyntaxError`)."""

    reply_code = ReplyCode.SYNTAX_ERROR


class CommandInvalid(ConnectionException):
    reply_code = ReplyCode.COMMAND_INVALID


class ChannelError(ConnectionException):
    reply_code = ReplyCode.CHANNEL_ERROR


class UnexpectedFrame(ConnectionException):
    reply_code = ReplyCode.UNEXPECTED_FRAME


class ResourceError(ConnectionException):
    reply_code = ReplyCode.RESOURCE_ERROR


class NotAllowed(ConnectionException):
    reply_code = ReplyCode.NOT_ALLOWED


class AMQPNotImplemented(ConnectionException):
    """Named to not shadow the builtin `NotImplemented` constant."""

    reply_code = ReplyCode.NOT_IMPLEMENTED


class InternalError(ConnectionException):
    reply_code = ReplyCode.INTERNAL_ERROR


ERROR_BY_REPLY_CODE: Final[dict[ReplyCode, type[AMQPError]]] = {
    cls.reply_code: cls
    for cls in (
        ContentTooLarge,
        NoRoute,
        NoConsumers,
        AccessRefused,
        NotFound,
        ResourceLocked,
        PreconditionFailed,
        ConnectionForced,
        InvalidPath,
        FrameError,
        AMQPSyntaxError,
        CommandInvalid,
        ChannelError,
        UnexpectedFrame,
        ResourceError,
        NotAllowed,
        AMQPNotImplemented,
        InternalError,
    )
}
"""The exception class for each error reply code, e.g. to raise what a peer's Close says."""


def error_for_reply_code(
    reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
) -> AMQPError:
    """Build the exception for a reply code received from a peer.

    An unknown or non-error code (200, or one outside the spec) becomes `InternalError`
    carrying the code in its text, since a peer sending it is itself misbehaving.
    """
    try:
        cls = ERROR_BY_REPLY_CODE[ReplyCode(reply_code)]
    except (ValueError, KeyError):
        return InternalError(f"unknown reply code {reply_code}: {reply_text}", class_id, method_id)
    return cls(reply_text, class_id, method_id)


REPLY_TEXT_BYTES_MAX: Final = 255  # a shortstr


def reply_text(exc: AMQPError) -> str:
    """The reply text of a close for `exc`, as RabbitMQ words and cuts it."""
    # RabbitMQ prefixes the code's name, e.g. "NOT_FOUND - no queue 'q' in vhost '/'".
    # A longer text is cut to 252 bytes and "..." (rabbit_binary_generator's
    # amqp_exception_explanation), so it fits the 255-byte shortstr. Texts quote peer
    # octets (names, frame payloads) kept as surrogateescape: they go out as those
    # octets, and the cut falls on the same byte as RabbitMQ's, mid-character or not.
    raw = f"{exc.reply_code.name} - {exc.reply_text}".encode("utf-8", "surrogateescape")
    if len(raw) > REPLY_TEXT_BYTES_MAX:
        raw = raw[: REPLY_TEXT_BYTES_MAX - 3] + b"..."
    return raw.decode("utf-8", "surrogateescape")
