"""`/api/exchanges`, as RabbitMQ's management API has it.

Owns the exchange endpoints: list (all vhosts, one vhost), get, declare (PUT: 201
created, 204 existed, 400 inequivalent), delete (`if-unused`), the bindings an exchange is
the source or destination of, and `POST .../publish` (`{"routed": bool}`, the message
durable before the reply). The default exchange is `amq.default` in paths. Writes need the
AMQP permission a client would need (configure to declare and delete, write to publish).
"""

from __future__ import annotations

import base64
import time
from typing import Final

from aiohttp import web

from http_gateway.context import caller, read_json_object, vhost_for, visible_vhosts
from http_gateway.errors import HttpError
from http_gateway.fields import flag, query_flag
from http_gateway.listing import list_response
from http_gateway.views import (
    binding_json,
    exchange_json,
    require_permission,
    require_topic_permission,
)
from streamq.broker.exchange import Destination, Exchange
from streamq.broker.stats import MessageStats
from streamq.broker.vhost import VHost

DEFAULT_EXCHANGE_PATH_NAME: Final = "amq.default"

routes = web.RouteTableDef()


def exchange_name(path_name: str) -> str:
    return "" if path_name == DEFAULT_EXCHANGE_PATH_NAME else path_name


def _list(request: web.Request, vhosts: list[VHost]) -> web.Response:
    out = []
    for vhost in vhosts:
        out += [exchange_json(vhost, e) for _, e in sorted(vhost.exchanges.items())]
    return list_response(request, out)


@routes.get("/api/exchanges")
async def list_all(request: web.Request) -> web.Response:
    return _list(request, visible_vhosts(caller(request)))


@routes.get("/api/exchanges/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    return _list(request, [vhost_for(caller(request), request.match_info["vhost"])])


def _exchange(request: web.Request) -> tuple[VHost, Exchange]:
    vhost = vhost_for(caller(request), request.match_info["vhost"])
    exchange = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    if exchange is None:
        raise HttpError(404, "Object Not Found")
    return vhost, exchange


@routes.get("/api/exchanges/{vhost}/{name}")
async def get(request: web.Request) -> web.Response:
    vhost, exchange = _exchange(request)
    return web.json_response(exchange_json(vhost, exchange))


@routes.put("/api/exchanges/{vhost}/{name}")
async def put(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = exchange_name(request.match_info["name"])
    body = await read_json_object(request)
    # Absent fields take exchange.declare's defaults (direct, not durable): RabbitMQ fills
    # that method's record from the body.
    exchange_type = body.get("type", "direct")
    if not isinstance(exchange_type, str):
        raise HttpError(400, "type must be a string: direct, fanout, topic, headers, ...")
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise HttpError(400, "arguments must be an object")
    durable = flag(body, "durable", False)
    auto_delete = flag(body, "auto_delete", False)
    internal = flag(body, "internal", False)
    require_permission(who, vhost.name, "configure", "exchange", name)
    existed = name in vhost.exchanges
    vhost.declare_exchange(
        name, exchange_type, False, durable, auto_delete, internal, arguments, who.user.name
    )
    await vhost.sync_all()
    return web.Response(status=204 if existed else 201)


@routes.delete("/api/exchanges/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    who = caller(request)
    vhost, exchange = _exchange(request)
    require_permission(who, vhost.name, "configure", "exchange", exchange.name)
    vhost.delete_exchange(exchange.name, query_flag(request.query, "if-unused"))
    await vhost.sync_all()
    return web.Response(status=204)


@routes.get("/api/exchanges/{vhost}/{name}/bindings/source")
async def bindings_source(request: web.Request) -> web.Response:
    vhost, exchange = _exchange(request)
    ordered = sorted(exchange.bindings, key=lambda b: (b.destination, b.routing_key))
    return web.json_response([binding_json(vhost.name, exchange.name, b) for b in ordered])


@routes.get("/api/exchanges/{vhost}/{name}/bindings/destination")
async def bindings_destination(request: web.Request) -> web.Response:
    vhost, exchange = _exchange(request)
    target = Destination("exchange", exchange.name)
    out = []
    for name, source in sorted(vhost.exchanges.items()):
        out += [
            binding_json(vhost.name, name, b)
            for b in sorted(source.bindings, key=lambda b: b.routing_key)
            if b.destination == target
        ]
    return web.json_response(out)


def _payload(body: dict[str, object]) -> bytes:
    payload = body.get("payload")
    encoding = body.get("payload_encoding")
    if not isinstance(payload, str):
        raise HttpError(400, "payload is required (a string)")
    if encoding == "string":
        return payload.encode("utf-8", "surrogateescape")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except ValueError:  # binascii.Error, or a character outside ASCII
            raise HttpError(400, "payload is not valid base64") from None
    raise HttpError(400, "payload_encoding must be string or base64")


@routes.post("/api/exchanges/{vhost}/{name}/publish")
async def publish(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = exchange_name(request.match_info["name"])
    body = await read_json_object(request)
    routing_key = body.get("routing_key")
    if not isinstance(routing_key, str):
        raise HttpError(400, "routing_key is required (a string)")
    properties = body.get("properties", {})
    if not isinstance(properties, dict):
        raise HttpError(400, "properties must be an object")
    payload = _payload(body)
    require_permission(who, vhost.name, "write", "exchange", name)
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        # RabbitMQ publishes through a channel even to a missing exchange (its POST allows
        # a missing resource) and answers the channel's 404 as a bad request.
        raise HttpError(400, f"404 NOT_FOUND - no exchange '{name}' in vhost '{vhost.name}'")
    if exchange.internal:
        raise HttpError(
            403, f"cannot publish to internal exchange '{exchange.name}' in vhost '{vhost.name}'"
        )
    require_topic_permission(who, vhost, "write", name, routing_key)
    codec = who.broker.properties_json
    if codec is None:
        raise HttpError(503, "the AMQP gateway is not running")
    try:
        properties_raw = codec.from_json(properties)
    except ValueError as exc:
        raise HttpError(400, f"bad properties: {exc}") from None
    headers = properties.get("headers") if isinstance(properties.get("headers"), dict) else None
    queues = vhost.route(exchange.name, routing_key, headers)
    offset = vhost.publish(
        exchange.name, routing_key, properties_raw, payload, queues, int(time.time() * 1000)
    )
    stats = vhost.exchange_stats.get(exchange.name)
    if stats is None:
        stats = vhost.exchange_stats[exchange.name] = MessageStats()
    stats.publish_in += 1
    if offset is None:
        vhost.stats.drop_unroutable += 1
        return web.json_response({"routed": False})
    stats.publish_out += 1
    await vhost.sync_all()
    return web.json_response({"routed": True})
