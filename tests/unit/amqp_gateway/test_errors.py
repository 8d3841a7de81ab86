"""Reply codes and the soft/hard exception families match the AMQP 0-9-1 spec."""

from __future__ import annotations

import pytest

from amqp_gateway import errors
from amqp_gateway.errors import (
    HARD_REPLY_CODES,
    SOFT_REPLY_CODES,
    ChannelException,
    ConnectionException,
    ReplyCode,
    error_for_reply_code,
)

SPEC_CODES = {
    200: "REPLY_SUCCESS",
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}


def test_reply_codes_are_exactly_the_spec_constants() -> None:
    assert {code.value: code.name for code in ReplyCode} == SPEC_CODES


def test_soft_codes_are_the_channel_level_ones_and_the_rest_are_hard() -> None:
    assert {int(c) for c in SOFT_REPLY_CODES} == {311, 312, 313, 403, 404, 405, 406}
    hard = {320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541}
    assert {int(c) for c in HARD_REPLY_CODES} == hard


@pytest.mark.parametrize("code", sorted(set(ReplyCode) - {ReplyCode.REPLY_SUCCESS}))
def test_every_error_code_has_one_class_in_the_right_family(code: ReplyCode) -> None:
    cls = errors.ERROR_BY_REPLY_CODE[code]
    assert cls.reply_code is code
    soft = code in SOFT_REPLY_CODES
    assert issubclass(cls, ChannelException) is soft
    assert issubclass(cls, ConnectionException) is not soft


def test_an_error_carries_the_offending_method() -> None:
    error = errors.NotFound("no queue 'q'", 50, 10)
    assert error.reply_code == ReplyCode.NOT_FOUND
    assert (error.reply_text, error.class_id, error.method_id) == ("no queue 'q'", 50, 10)
    assert "NOT_FOUND (404)" in str(error)


def test_error_for_reply_code_builds_the_typed_exception() -> None:
    error = error_for_reply_code(406, "inequivalent arg", 50, 10)
    assert type(error) is errors.PreconditionFailed
    assert (error.class_id, error.method_id) == (50, 10)
    odd = error_for_reply_code(599, "?")
    assert type(odd) is errors.InternalError
    assert "599" in odd.reply_text
    assert type(error_for_reply_code(200, "ok")) is errors.InternalError


def test_protocol_header_mismatch_is_a_frame_error_with_our_header() -> None:
    error = errors.ProtocolHeaderMismatch("bad", b"GET / HT", b"AMQP\x00\x00\x09\x01")
    assert isinstance(error, errors.FrameError)
    assert error.reply_code == ReplyCode.FRAME_ERROR
    assert error.supported_header == b"AMQP\x00\x00\x09\x01"
