"""The gateway's errors: a refused request carries the stream protocol's response code.

`StreamError` answers one request with its code (the connection goes on);
`ConnectionError_` closes the connection with Close(code). `response_code` maps the broker
core's domain errors to codes in one place, as amqp_gateway/errormap.py does for AMQP.
"""

from __future__ import annotations

from stream_gateway.codec.constants import ResponseCode
from streamq.broker.errors import (
    AccessRefused,
    BrokerError,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    QueueUnavailable,
)


class StreamError(Exception):
    """A request refused with `code`; the connection stays open."""

    def __init__(self, code: ResponseCode, text: str = "") -> None:
        super().__init__(text or code.name)
        self.code = code


class CloseConnection(Exception):
    """The connection closes with Close(`code`, `reason`)."""

    def __init__(self, code: ResponseCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def response_code(exc: BrokerError) -> ResponseCode:
    """The stream protocol's code for a broker core error (RabbitMQ's choices)."""
    if isinstance(exc, AccessRefused | NotAllowed):
        return ResponseCode.ACCESS_REFUSED
    if isinstance(exc, NotFound):
        return ResponseCode.STREAM_DOES_NOT_EXIST
    if isinstance(exc, QueueUnavailable):
        return ResponseCode.STREAM_NOT_AVAILABLE
    if isinstance(exc, PreconditionFailed):
        return ResponseCode.PRECONDITION_FAILED
    return ResponseCode.INTERNAL_ERROR
