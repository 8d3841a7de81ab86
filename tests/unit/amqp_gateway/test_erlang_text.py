"""RabbitMQ's frame error texts: every expected string here is what `erl` (OTP 25, as
RabbitMQ 3.10 runs on) printed for the same format and arguments."""

from __future__ import annotations

import pytest

from amqp_gateway.codec.erlang_text import ErlangTerm, frame_error_text, unexpected_frame_text

FRAME_ERRORS: list[tuple[int, bytes, ErlangTerm, str]] = [
    (
        3,
        b"",
        ("frame_too_large", 4097, 4088),
        "type 3, all octets = <<>>: {frame_too_large,4097,4088}",
    ),
    (5, b"abc", "unknown_frame", 'type 5, all octets = <<"abc">>: unknown_frame'),
    (1, b"a\nb", "unknown_frame", 'type 1, all octets = <<"a\\nb">>: unknown_frame'),
    (1, b'a"b\\', "unknown_frame", 'type 1, all octets = <<"a\\"b\\\\">>: unknown_frame'),
    (
        1,
        bytes([0, 60, 0, 10, 0, 0, 0, 0, 0, 1, 0]),
        ("invalid_frame_end_marker", 205),
        "type 1, all octets = <<0,60,0,10,0,0,0,0,0,1,0>>: {invalid_frame_end_marker,\n"
        + " " * 51
        + "205}",
    ),
    (
        1,
        bytes([0, 200, 255, 255, 250, 201] + [100] * 10),
        "unknown_frame",
        "type 1, all octets = <<0,200,255,255,250,201,100,100,100,100,100,100,100,100,\n"
        + " " * 23
        + "100,100>>: unknown_frame",
    ),
    (
        1,
        bytes([0, 200, 255, 255, 250, 201] + [100] * 12),
        ("invalid_frame_end_marker", 205),
        "type 1, first 16 octets = <<0,200,255,255,250,201,100,100,100,100,100,100,100,\n"
        + " " * 28
        + "100,100,100>>: {invalid_frame_end_marker,205}",
    ),
    (
        200,
        bytes([99, 1, 9, 1, 10, 200, 10, 255, 255, 200, 9, 10, 10, 99, 255, 200, 7]),
        "unknown_frame",
        "type 200, first 16 octets = <<99,1,9,1,10,200,10,255,255,200,9,10,10,99,255,200>>: "
        "unknown_frame",
    ),
]


@pytest.mark.parametrize(("frame_type", "payload", "reason", "expected"), FRAME_ERRORS)
def test_frame_error_text_is_what_erlang_prints(
    frame_type: int, payload: bytes, reason: ErlangTerm, expected: str
) -> None:
    assert frame_error_text(frame_type, payload, reason) == expected


def test_unexpected_frame_text_has_no_reason() -> None:
    assert unexpected_frame_text(8, b"") == "type 8, all octets = <<>>"
    assert unexpected_frame_text(1, bytes([0, 20, 0, 10, 0])) == (
        "type 1, all octets = <<0,20,0,10,0>>"
    )


def test_printable_high_octets_go_out_as_the_octets_themselves() -> None:
    """RabbitMQ prints a Latin-1 octet of a payload as that one octet of its reply text;
    ours carries it through surrogateescape, so the shortstr holds the same byte (not its
    two-byte UTF-8 encoding), and columns count it as one."""
    text = frame_error_text(1, b"caf\xe9", "unknown_frame")
    assert text.encode("utf-8", "surrogateescape") == (
        b'type 1, all octets = <<"caf\xe9">>: unknown_frame'
    )
