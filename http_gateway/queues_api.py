"""`/api/queues`, as RabbitMQ's management API has it.

Owns the queue endpoints: list (all vhosts, one vhost), get, declare (PUT: 201 created,
204 existed, 400 inequivalent), delete (`if-empty`, `if-unused`), the queue's bindings,
purge (`DELETE .../contents`) and `POST .../get`. Writes need the AMQP permission a client
would need (configure to declare and delete, read to purge and get) and are durable before
the reply.
"""

from __future__ import annotations

import base64
import time
from typing import Final

from aiohttp import web

from http_gateway.context import caller, read_json_object, vhost_for, visible_vhosts
from http_gateway.errors import HttpError
from http_gateway.fields import bounded_integer, flag, query_flag
from http_gateway.listing import list_response
from http_gateway.views import (
    binding_json,
    consumers_of,
    default_binding_json,
    queue_json,
    require_permission,
)
from streamq.broker.account_limits import MAX_QUEUES
from streamq.broker.exchange import Destination
from streamq.broker.queue import Queue
from streamq.broker.vhost import VHost

ACK_MODES: Final = frozenset(
    {"ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false"}
)
GET_COUNT_MAX: Final = 10_000  # messages one POST .../get may take

routes = web.RouteTableDef()


def _list(request: web.Request, vhosts: list[VHost]) -> web.Response:
    broker = caller(request).broker
    out = []
    for vhost in vhosts:
        consumers = consumers_of(broker, vhost.name)
        out += [
            queue_json(vhost, q, consumers.get(name, []))
            for name, q in sorted(vhost.queues.items())
        ]
    return list_response(request, out)


@routes.get("/api/queues")
async def list_all(request: web.Request) -> web.Response:
    return _list(request, visible_vhosts(caller(request)))


@routes.get("/api/queues/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    return _list(request, [vhost_for(caller(request), request.match_info["vhost"])])


def _queue(request: web.Request) -> tuple[VHost, Queue]:
    vhost = vhost_for(caller(request), request.match_info["vhost"])
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise HttpError(404, "Object Not Found")
    return vhost, queue


@routes.get("/api/queues/{vhost}/{name}")
async def get(request: web.Request) -> web.Response:
    vhost, queue = _queue(request)
    consumers = consumers_of(caller(request).broker, vhost.name).get(queue.name, [])
    return web.json_response(queue_json(vhost, queue, consumers))


def _arguments(body: dict[str, object]) -> dict[str, object]:
    arguments = body.get("arguments", {})
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise HttpError(400, "arguments must be an object")
    return arguments


@routes.put("/api/queues/{vhost}/{name}")
async def put(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = request.match_info["name"]
    body = await read_json_object(request)
    # Absent flags take queue.declare's defaults, as RabbitMQ fills that method's record
    # from the body: not durable (rabbitmqadmin and the UIs send durable explicitly).
    durable = flag(body, "durable", False)
    auto_delete = flag(body, "auto_delete", False)
    arguments = _arguments(body)
    require_permission(who, vhost.name, "configure", "queue", name)
    existed = name in vhost.queues
    queue_max = who.broker.accounts.vhost_limit(vhost.name, MAX_QUEUES)
    vhost.declare_queue(
        name, False, durable, False, auto_delete, arguments, None, queue_max=queue_max
    )
    await vhost.sync_all()
    return web.Response(status=204 if existed else 201)


@routes.delete("/api/queues/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    who = caller(request)
    vhost, queue = _queue(request)
    require_permission(who, vhost.name, "configure", "queue", queue.name)
    consumers = list(queue.consumers)
    vhost.delete_queue(
        queue.name,
        query_flag(request.query, "if-unused"),
        query_flag(request.query, "if-empty"),
        queue.exclusive_owner,
    )
    for consumer in consumers:
        consumer.cancel_by_broker()
    await vhost.sync_all()
    return web.Response(status=204)


@routes.get("/api/queues/{vhost}/{name}/bindings")
async def bindings(request: web.Request) -> web.Response:
    vhost, queue = _queue(request)
    target = Destination("queue", queue.name)
    out = [default_binding_json(vhost.name, queue.name)]
    for name, exchange in sorted(vhost.exchanges.items()):
        out += [
            binding_json(vhost.name, name, b)
            for b in sorted(exchange.bindings, key=lambda b: b.routing_key)
            if b.destination == target
        ]
    return web.json_response(out)


@routes.delete("/api/queues/{vhost}/{name}/contents")
async def purge(request: web.Request) -> web.Response:
    who = caller(request)
    vhost, queue = _queue(request)
    require_permission(who, vhost.name, "read", "queue", queue.name)
    vhost.purge_queue(queue.name, queue.exclusive_owner)
    await vhost.sync_all()
    return web.Response(status=204)


def _get_options(body: dict[str, object]) -> tuple[int, str, str, int | None]:
    # 0 takes nothing, as in RabbitMQ. A negative count takes the whole queue there (its
    # loop counts down past zero); streamq refuses it, as it refuses more than the max.
    count = bounded_integer(body.get("count"), "count", 0, GET_COUNT_MAX)
    ackmode = body.get("ackmode")
    if not isinstance(ackmode, str) or ackmode not in ACK_MODES:  # a JSON object: unhashable
        raise HttpError(400, "ackmode must be one of " + ", ".join(sorted(ACK_MODES)))
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise HttpError(400, "encoding must be auto or base64")
    given = body.get("truncate")
    truncate = None if given is None else bounded_integer(given, "truncate", 0)
    assert isinstance(ackmode, str) and isinstance(encoding, str)
    return count, ackmode, encoding, truncate


def payload_json(body: bytes, encoding: str, truncate: int | None) -> dict[str, object]:
    """RabbitMQ's payload fields: as a string when `auto` and the body is UTF-8."""
    shown = body if truncate is None else body[:truncate]
    if encoding == "auto":
        try:
            return {"payload": shown.decode("utf-8"), "payload_encoding": "string"}
        except UnicodeDecodeError:
            pass
    return {"payload": base64.b64encode(shown).decode(), "payload_encoding": "base64"}


@routes.post("/api/queues/{vhost}/{name}/get")
async def get_messages(request: web.Request) -> web.Response:
    who = caller(request)
    vhost, queue = _queue(request)
    count, ackmode, encoding, truncate = _get_options(await read_json_object(request))
    require_permission(who, vhost.name, "read", "queue", queue.name)
    if queue.stream is not None:
        raise HttpError(400, f"queue '{queue.name}' is a stream: read it with a consumer")
    if queue.failed is not None:
        raise HttpError(503, f"queue '{queue.name}' is unavailable: {queue.failed}")
    codec = who.broker.properties_json
    now_ms = int(time.time() * 1000)
    queue.last_used_s = time.monotonic()  # as basic.get, renews the x-expires lease
    taken: list[int] = []
    out: list[dict[str, object]] = []
    while len(taken) < count and (got := vhost.get(queue, now_ms)) is not None:
        ready, record = got
        taken.append(ready.offset)
        out.append(
            {
                "payload_bytes": len(record.body),
                "redelivered": ready.redelivered,
                "exchange": record.exchange.decode("utf-8", "surrogateescape"),
                "routing_key": record.routing_key.decode("utf-8", "surrogateescape"),
                "message_count": queue.cursor.message_count,
                "properties": codec.to_json(record.properties) if codec else {},
                **payload_json(record.body, encoding, truncate),
            }
        )
    # As RabbitMQ: every message is taken first, then requeued, acked or rejected, so a
    # requeueing get does not see the same message twice.
    for offset in taken:
        if ackmode.endswith("requeue_true"):
            vhost.requeue(queue, offset)
        elif ackmode == "ack_requeue_false":
            vhost.settle(queue, offset)
        else:
            vhost.reject(queue, offset)
    queue.stats.get += len(taken)
    if ackmode == "ack_requeue_false":
        queue.stats.ack += len(taken)
    vhost.kick(queue)
    await vhost.sync_all()
    return web.json_response(out)
