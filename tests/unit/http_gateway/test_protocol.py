"""The HTTP request reader: whole and split requests, keep-alive, and the limits."""

from __future__ import annotations

import pytest

from http_gateway.protocol import (
    BODY_BYTES_MAX,
    HEAD_BYTES_MAX,
    HttpError,
    RequestReader,
    Response,
)

PUT = (
    b"PUT /api/policies/%2F/ttl?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 7\r\n"
    b'Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n\r\n{"a":1}'
)


def test_a_request_fed_at_once_and_byte_by_byte() -> None:
    whole = RequestReader().feed(PUT)
    reader = RequestReader()
    pieces = [r for i in range(len(PUT)) for r in reader.feed(PUT[i : i + 1])]
    assert whole == pieces
    [request] = whole
    assert (request.method, request.segments, request.query) == (
        "PUT",
        ("api", "policies", "/", "ttl"),
        "x=1",
    )
    assert request.json() == {"a": 1}
    assert request.keep_alive
    assert request.headers["authorization"].startswith("Basic ")


def test_pipelined_requests_and_connection_close() -> None:
    data = b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n"
    first, second = RequestReader().feed(data)
    assert (first.path, first.keep_alive, second.path, second.keep_alive) == (
        "/a",
        True,
        "/b",
        False,
    )
    [old] = RequestReader().feed(b"GET / HTTP/1.0\r\n\r\n")
    assert not old.keep_alive


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nNo colon\r\n\r\n", 400),
        (b"PUT / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
        (b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
        (f"PUT / HTTP/1.1\r\nContent-Length: {BODY_BYTES_MAX + 1}\r\n\r\n".encode(), 413),
        (b"GET / HTTP/1.1\r\nX: " + b"y" * HEAD_BYTES_MAX + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nX: " + b"y" * HEAD_BYTES_MAX, 431),  # no end of head in sight
    ],
)
def test_bad_requests_get_the_right_status(data: bytes, status: int) -> None:
    with pytest.raises(HttpError) as raised:
        RequestReader().feed(data)
    assert raised.value.status == status


def test_a_body_that_is_not_json_is_400() -> None:
    [request] = RequestReader().feed(b"PUT / HTTP/1.1\r\nContent-Length: 3\r\n\r\n{x}")
    with pytest.raises(HttpError, match="not JSON"):
        request.json()


def test_responses() -> None:
    assert Response(204).encode(True) == (
        b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"
    )
    encoded = Response(200, {"a": 1}).encode(False)
    assert encoded.endswith(b'\r\n\r\n{"a": 1}') and b"Connection: close" in encoded
