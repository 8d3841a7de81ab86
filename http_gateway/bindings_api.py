"""`/api/bindings`, as RabbitMQ's management API has it.

Owns the binding endpoints: list (all vhosts, one vhost), the bindings between one
exchange and one queue (`e/{x}/q/{q}`) or exchange (`e/{x}/e/{dst}`): list, create (POST:
201 with a Location naming the new binding), get and delete one by its `properties_key`.
Binding and unbinding need write on the destination and read on the source, as AMQP. A
change is durable before the reply.
"""

from __future__ import annotations

from urllib.parse import quote_plus, unquote

from aiohttp import web

from http_gateway.context import Caller, caller, read_json_object, vhost_for, visible_vhosts
from http_gateway.errors import HttpError
from http_gateway.exchanges_api import exchange_name
from http_gateway.listing import list_response
from http_gateway.views import (
    all_bindings,
    binding_json,
    properties_key,
    require_permission,
    require_topic_permission,
    unfrozen,
)
from streamq.broker.exchange import Binding, Destination
from streamq.broker.vhost import VHost

routes = web.RouteTableDef()

KINDS = {"q": "queue", "e": "exchange"}


@routes.get("/api/bindings")
async def list_all(request: web.Request) -> web.Response:
    out = []
    for vhost in visible_vhosts(caller(request)):
        out += all_bindings(vhost)
    return list_response(request, out, pageable=False)


@routes.get("/api/bindings/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    vhost = vhost_for(caller(request), request.match_info["vhost"])
    return list_response(request, all_bindings(vhost), pageable=False)


def _ends(request: web.Request) -> tuple[Caller, VHost, str, Destination]:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    source = exchange_name(request.match_info["source"])
    kind = KINDS[request.match_info["kind"]]
    name = request.match_info["destination"]
    if kind == "exchange":
        name = exchange_name(name)
    if source not in vhost.exchanges:
        raise HttpError(404, "Object Not Found")
    if (kind == "queue" and name not in vhost.queues) or (
        kind == "exchange" and name not in vhost.exchanges
    ):
        raise HttpError(404, "Object Not Found")
    return who, vhost, source, Destination(kind, name)


def _between(vhost: VHost, source: str, destination: Destination) -> list[Binding]:
    return sorted(
        (b for b in vhost.exchanges[source].bindings if b.destination == destination),
        key=lambda b: b.routing_key,
    )


PAIR = r"/api/bindings/{vhost}/e/{source}/{kind:q|e}/{destination}"


@routes.get(PAIR)
async def list_pair(request: web.Request) -> web.Response:
    _, vhost, source, destination = _ends(request)
    bindings = _between(vhost, source, destination)
    return web.json_response([binding_json(vhost.name, source, b) for b in bindings])


def _check(
    who: Caller, vhost: VHost, source: str, destination: Destination, routing_key: str
) -> None:
    require_permission(who, vhost.name, "write", destination.kind, destination.name)
    require_permission(who, vhost.name, "read", "exchange", source)
    require_topic_permission(who, vhost, "read", source, routing_key)


@routes.post(PAIR)
async def create(request: web.Request) -> web.Response:
    who, vhost, source, destination = _ends(request)
    body = await read_json_object(request)
    routing_key = body.get("routing_key", "")
    arguments = body.get("arguments") or {}
    if not isinstance(routing_key, str):
        raise HttpError(400, "routing_key must be a string")
    if not isinstance(arguments, dict):
        raise HttpError(400, "arguments must be an object")
    _check(who, vhost, source, destination, routing_key)
    vhost.bind(destination, source, routing_key, arguments)
    await vhost.sync_all()
    # Relative to the request's path, as RabbitMQ's: the destination, then the binding's
    # properties_key, each quoted once more as its rabbit_mgmt_format:url quotes them.
    props = properties_key(routing_key, arguments)
    target = quote_plus(request.match_info["destination"], safe="")
    location = f"{target}/{quote_plus(props, safe='')}"
    return web.Response(status=201, headers={"Location": location})


def _one(vhost: VHost, source: str, destination: Destination, props: str) -> Binding:
    for binding in _between(vhost, source, destination):
        key = properties_key(binding.routing_key, unfrozen(binding.arguments))
        if props in (key, unquote(key)):
            return binding
    raise HttpError(404, "Object Not Found")


@routes.get(PAIR + "/{props}")
async def get(request: web.Request) -> web.Response:
    _, vhost, source, destination = _ends(request)
    binding = _one(vhost, source, destination, request.match_info["props"])
    return web.json_response(binding_json(vhost.name, source, binding))


@routes.delete(PAIR + "/{props}")
async def delete(request: web.Request) -> web.Response:
    who, vhost, source, destination = _ends(request)
    binding = _one(vhost, source, destination, request.match_info["props"])
    _check(who, vhost, source, destination, binding.routing_key)
    vhost.unbind(destination, source, binding.routing_key, unfrozen(binding.arguments))
    await vhost.sync_all()
    return web.Response(status=204)
