"""`/api/stream-files`: a stream's segment log files, for the Spark source's remote reads.

Owns the read-only endpoint that lets a Spark executor without the broker's disk read a
stream's log as `spark_source.store.HttpStore` expects:

    GET /api/stream-files/<vhost>/<stream>
        200 {"files": {"<name>": <size>, ...}}: the segments, index files and `durable`
    GET /api/stream-files/<vhost>/<stream>/<name>?position=<p>&length=<n>
        200 application/octet-stream: up to n bytes of the file from byte p
        (fewer at the end of the file); 404 when the file is gone (retention)

The client decodes and checks everything itself (`docs/log-format.md`), and reads only
below the `durable` marker, exactly as with direct reads. Access needs a user with
access to the vhost (any tag: reading a stream is what its consumers do over AMQP).
File reads run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs

from http_gateway.protocol import REASONS, HttpError, Request, Response
from streamq.log import format as fmt

if TYPE_CHECKING:
    from http_gateway.server import Caller

READ_BYTES_MAX: Final = 130 * 1024 * 1024  # one record of the largest message, and more


@dataclass(slots=True)
class BytesResponse(Response):
    """A response whose body is raw bytes (the JSON `Response` cannot carry them)."""

    data: bytes = b""

    def encode(self, keep_alive: bool) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {REASONS.get(self.status, 'Status')}",
            "Content-Type: application/octet-stream",
            f"Content-Length: {len(self.data)}",
            "Connection: keep-alive" if keep_alive else "Connection: close",
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.data


def _is_log_file(name: str) -> bool:
    if name == fmt.DURABLE_FILE:
        return True
    stem, _, suffix = name.partition(".")
    return (
        "." + suffix in (fmt.SEGMENT_SUFFIX, fmt.INDEX_SUFFIX)
        and len(stem) == fmt.OFFSET_DIGITS
        and stem.isdigit()
    )


async def handle(caller: Caller, request: Request) -> Response:
    if request.method != "GET":
        raise HttpError(405, f"{request.method} is not allowed here")
    rest = request.segments[2:]
    if len(rest) not in (2, 3):
        raise HttpError(404, "Not Found")
    directory = _stream_directory(caller, rest[0], rest[1])
    if len(rest) == 2:
        return Response(200, {"files": await asyncio.to_thread(_list, directory)})
    name = rest[2]
    if not _is_log_file(name):
        raise HttpError(404, f"no log file {name!r}")
    position, length = _range(request.query)
    data = await asyncio.to_thread(_read, os.path.join(directory, name), position, length)
    return BytesResponse(200, data=data)


def _stream_directory(caller: Caller, vhost_name: str, stream: str) -> str:
    vhost = caller.broker.vhosts.get(vhost_name)
    if vhost is None:
        raise HttpError(404, f"vhost {vhost_name} not found")
    if "administrator" not in caller.user.tags and not caller.broker.accounts.vhost_access(
        caller.user.name, vhost_name
    ):
        user = caller.user.name
        raise HttpError(403, f"access to vhost '{vhost_name}' refused for user '{user}'")
    queue = vhost.queues.get(stream)
    if queue is None or queue.stream is None:
        raise HttpError(404, f"no stream '{stream}' in vhost '{vhost_name}'")
    # The broker's naming of stream directories (vhost_store._stream_dir).
    return os.path.join(
        caller.broker.data_dir,
        "vhosts",
        hashlib.sha1(vhost_name.encode()).hexdigest(),
        "streams",
        hashlib.sha1(stream.encode("utf-8", "surrogateescape")).hexdigest(),
    )


def _range(query: str) -> tuple[int, int]:
    params = parse_qs(query)
    try:
        position = int(params.get("position", ["0"])[0])
        length = int(params.get("length", [str(READ_BYTES_MAX)])[0])
    except ValueError:
        raise HttpError(400, "position and length must be integers") from None
    if position < 0 or length < 0:
        raise HttpError(400, "position and length must not be negative")
    return position, min(length, READ_BYTES_MAX)


def _list(directory: str) -> dict[str, int]:
    files = {}
    for entry in os.scandir(directory):
        if _is_log_file(entry.name):
            try:
                files[entry.name] = entry.stat().st_size
            except FileNotFoundError:
                continue  # deleted by retention while listing
    return files


def _read(path: str, position: int, length: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(position)
            return f.read(length)
    except FileNotFoundError:
        raise HttpError(404, "the file is gone (retention)") from None
