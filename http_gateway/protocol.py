"""HTTP/1.1 requests and responses, sans-IO: bytes in, `Request`s out; `Response` to bytes.

Owns the wire format of the management API: request line, headers and a body sized by
Content-Length, keep-alive, and the limits (`HEAD_BYTES_MAX`, `BODY_BYTES_MAX`) past which
a request is refused with the right status. It has no sockets, clock or routing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote

HEAD_BYTES_MAX: Final = 16 * 1024
BODY_BYTES_MAX: Final = 1024 * 1024
HEADERS_MAX: Final = 100
REASONS: Final = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


class HttpError(Exception):
    """A request the server answers with `status` and closes the connection after."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # percent-decoded segments joined again; see `segments`
    segments: tuple[str, ...]  # the path split on "/" before decoding, then decoded
    query: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    keep_alive: bool

    def json(self) -> object:
        """The body as JSON. Raises HttpError 400 if it is not."""
        try:
            return json.loads(self.body or b"null")
        except ValueError as exc:
            raise HttpError(400, f"the body is not JSON: {exc}") from None


@dataclass(slots=True)
class Response:
    status: int
    body: object = None  # JSON, or None for no body
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self, keep_alive: bool) -> bytes:
        payload = b"" if self.body is None else json.dumps(self.body).encode()
        lines = [f"HTTP/1.1 {self.status} {REASONS.get(self.status, 'Status')}"]
        if self.body is not None:
            lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(payload)}")
        lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
        lines.extend(f"{name}: {value}" for name, value in self.headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def error(status: int, reason: str) -> Response:
    """RabbitMQ's error body: {"error": ..., "reason": ...}."""
    kind = REASONS.get(status, "error").lower().replace(" ", "_")
    return Response(status, {"error": kind, "reason": reason})


class RequestReader:
    """Feed bytes; take complete requests. Raises HttpError for a malformed or too large
    request (the connection is then closed after the error response)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Request]:
        self._buffer += data
        requests: list[Request] = []
        while True:
            request = self._next()
            if request is None:
                return requests
            requests.append(request)

    def _next(self) -> Request | None:
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > HEAD_BYTES_MAX:
                raise HttpError(431, "request head too large")
            return None
        if end > HEAD_BYTES_MAX:
            raise HttpError(431, "request head too large")
        method, target, version, headers = _parse_head(bytes(buffer[:end]))
        if "transfer-encoding" in headers:
            raise HttpError(501, "chunked request bodies are not supported")
        length = _content_length(headers)
        total = end + 4 + length
        if len(buffer) < total:
            return None
        body = bytes(buffer[end + 4 : total])
        del buffer[:total]
        raw_path, _, query = target.partition("?")
        segments = tuple(unquote(part) for part in raw_path.split("/")[1:])
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        return Request(method, unquote(raw_path), segments, query, headers, body, keep_alive)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise HttpError(400, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[1].startswith("/"):
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(400, f"unsupported version {version}")
    if len(lines) - 1 > HEADERS_MAX:
        raise HttpError(431, "too many headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        headers[name.lower()] = value.strip()
    return method, target, version, headers


def _content_length(headers: dict[str, str]) -> int:
    text = headers.get("content-length", "0")
    if not text.isdigit():
        raise HttpError(400, "bad Content-Length")
    length = int(text)
    if length > BODY_BYTES_MAX:
        raise HttpError(413, f"bodies are at most {BODY_BYTES_MAX} bytes")
    return length
