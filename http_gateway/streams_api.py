"""`POST /api/queues/{vhost}/{name}/stream`: read a stream queue by offset, no consumer.

Owns reading a stream over HTTP (as LavinMQ's management UI browses a stream): up to
`count` durable messages from a starting point (`offset`: "first", "last" or an offset;
or `timestamp_ms`), each as `POST .../get` shows a message plus its `offset` and
`timestamp_ms`. Reading consumes nothing and needs the read permission on the queue.

The stream's log (`SegmentLog`) belongs to the event-loop thread (its read descriptors
are shared with the consumers' drains), so the reads run on the loop as a consumer's
drain does: `READ_RECORDS_MAX` records per read (preads of recent, page-cached data),
yielding to the loop between reads, and at most `READ_BYTES_MAX` bytes of bodies.
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web

from http_gateway.context import caller, read_json_object, vhost_for
from http_gateway.errors import HttpError
from http_gateway.queues_api import payload_json
from http_gateway.views import require_permission
from streamq.log import format as fmt
from streamq.log.amqp10 import as_amqp091
from streamq.log.errors import LogError
from streamq.queues.stream import StreamQueue, StreamStart

READ_COUNT_MAX: Final = 10_000  # messages one request may read
READ_BYTES_MAX: Final = 64 * 1024 * 1024  # bodies one answer holds; fewer messages past it
START_KINDS: Final = frozenset({"first", "last"})

routes = web.RouteTableDef()


def _natural(value: object) -> int | None:
    """`value` if it is a non-negative integer (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def parse_start(body: dict[str, object]) -> StreamStart:
    """Where to start: `offset` ("first" (the default), "last", or an offset, raised to
    the first one retention kept) or `timestamp_ms` (the first message appended then or
    later). Raises HttpError 400."""
    offset = body.get("offset")
    timestamp_ms = body.get("timestamp_ms")
    if offset is not None and timestamp_ms is not None:
        raise HttpError(400, "give offset or timestamp_ms, not both")
    if timestamp_ms is not None:
        at_ms = _natural(timestamp_ms)
        if at_ms is None:
            raise HttpError(400, "timestamp_ms must be a non-negative integer (epoch ms)")
        return StreamStart("time", at_ms)
    if offset is None:
        return StreamStart("first")
    if isinstance(offset, str) and offset in START_KINDS:
        return StreamStart(offset)
    number = _natural(offset)
    if number is None:
        raise HttpError(400, "offset must be first, last or a non-negative integer")
    return StreamStart("offset", number)


def parse_read(body: dict[str, object]) -> tuple[int, str, int | None]:
    """count, encoding and truncate, as `POST .../get` takes them. Raises HttpError 400."""
    count = _natural(body.get("count", 1))
    if count is None or not 0 < count <= READ_COUNT_MAX:
        raise HttpError(400, f"count must be an integer from 1 to {READ_COUNT_MAX}")
    encoding = body.get("encoding", "auto")
    if not isinstance(encoding, str) or encoding not in ("auto", "base64"):
        raise HttpError(400, "encoding must be auto or base64")
    truncate = body.get("truncate")
    if truncate is None:
        return count, encoding, None
    kept = _natural(truncate)
    if kept is None:
        raise HttpError(400, "truncate must be a non-negative integer")
    return count, encoding, kept


async def read_records(stream: StreamQueue, start: int, count: int) -> list[fmt.Record]:
    """Up to `count` durable records from `start`, at most READ_BYTES_MAX of bodies (and
    at least one record). Raises LogError."""
    out: list[fmt.Record] = []
    offset = start
    body_bytes = 0
    while len(out) < count and body_bytes < READ_BYTES_MAX:
        batch = stream.read(offset)
        if not batch:
            break
        for record in batch[: count - len(out)]:
            if out and body_bytes + len(record.body) > READ_BYTES_MAX:
                return out
            out.append(record)
            body_bytes += len(record.body)
        offset = batch[-1].offset + 1
        await asyncio.sleep(0)  # let the loop serve others between reads
    return out


@routes.post("/api/queues/{vhost}/{name}/stream")
async def read_stream(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise HttpError(404, "Object Not Found")
    body = await read_json_object(request)
    start = parse_start(body)
    count, encoding, truncate = parse_read(body)
    require_permission(who, vhost.name, "read", "queue", queue.name)
    stream = queue.stream
    if stream is None:
        raise HttpError(400, f"queue '{queue.name}' in vhost '{vhost.name}' is not a stream")
    if queue.failed is not None:
        raise HttpError(503, f"queue '{queue.name}' is unavailable: {queue.failed}")
    try:
        records = await read_records(stream, stream.start_offset(start), count)
    except LogError as exc:
        raise HttpError(503, f"queue '{queue.name}' could not be read: {exc}") from None
    records = [as_amqp091(queue.name, r) for r in records]  # stream clients' as AMQP sees them
    codec = who.broker.properties_json
    end = stream.log.durable_next
    return web.json_response(
        [
            {
                "offset": r.offset,
                "timestamp_ms": r.timestamp_ms,
                "payload_bytes": len(r.body),
                "redelivered": False,
                "exchange": r.exchange.decode("utf-8", "surrogateescape"),
                "routing_key": r.routing_key.decode("utf-8", "surrogateescape"),
                "message_count": end - r.offset - 1,  # messages after this one
                "properties": codec.to_json(r.properties) if codec else {},
                **payload_json(r.body, encoding, truncate),
            }
            for r in records
        ]
    )
