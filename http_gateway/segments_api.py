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
from typing import Final

from aiohttp import web

from http_gateway.context import caller, vhost_for
from http_gateway.errors import HttpError
from streamq.log import format as fmt

READ_BYTES_MAX: Final = 130 * 1024 * 1024  # one record of the largest message, and more

routes = web.RouteTableDef()


def _is_log_file(name: str) -> bool:
    if name == fmt.DURABLE_FILE:
        return True
    stem, _, suffix = name.partition(".")
    return (
        "." + suffix in (fmt.SEGMENT_SUFFIX, fmt.INDEX_SUFFIX)
        and len(stem) == fmt.OFFSET_DIGITS
        and stem.isdigit()
    )


@routes.get("/api/stream-files/{vhost}/{stream}")
async def list_files(request: web.Request) -> web.Response:
    directory = _stream_directory(request)
    return web.json_response({"files": await asyncio.to_thread(_list, directory)})


@routes.get("/api/stream-files/{vhost}/{stream}/{name}")
async def read_file(request: web.Request) -> web.Response:
    directory = _stream_directory(request)
    name = request.match_info["name"]
    if not _is_log_file(name):
        raise HttpError(404, f"no log file {name!r}")
    position, length = _range(request)
    data = await asyncio.to_thread(_read, os.path.join(directory, name), position, length)
    return web.Response(body=data, content_type="application/octet-stream")


def _stream_directory(request: web.Request) -> str:
    vhost_name, stream = request.match_info["vhost"], request.match_info["stream"]
    who = caller(request)
    vhost = vhost_for(who, vhost_name)
    # Reading messages needs permissions on the vhost (tags that see every vhost do not).
    if not who.is_admin and not who.broker.accounts.vhost_access(who.user.name, vhost_name):
        raise HttpError(403, f"access to vhost '{vhost_name}' refused for user '{who.user.name}'")
    queue = vhost.queues.get(stream)
    if queue is None or queue.stream is None:
        raise HttpError(404, f"no stream '{stream}' in vhost '{vhost_name}'")
    # The broker's naming of stream directories (vhost_store._stream_dir).
    return os.path.join(
        who.broker.data_dir,
        "vhosts",
        hashlib.sha1(vhost_name.encode()).hexdigest(),
        "streams",
        hashlib.sha1(stream.encode("utf-8", "surrogateescape")).hexdigest(),
    )


def _range(request: web.Request) -> tuple[int, int]:
    try:
        position = int(request.query.get("position", "0"))
        length = int(request.query.get("length", str(READ_BYTES_MAX)))
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
