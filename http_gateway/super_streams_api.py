"""`/api/stream/super-streams/{vhost}/{name}`: create, show and delete super streams.

Owns the management API's side of RabbitMQ's super streams (what `rabbitmq-streams
add_super_stream` does): PUT with `partitions` (N partitions `{name}-0` .. `{name}-N-1`
bound with keys "0" .. "N-1") or `binding_keys` (one partition `{name}-{key}` per key),
and optional `arguments` in the stream protocol's names (`max-length-bytes`, `max-age`,
`stream-max-segment-size-bytes`, `initial-cluster-size`); GET lists the partitions in
order; DELETE removes the exchange and its partitions. The layout is the broker core's
(`streamq.broker.stream_definitions`), shared with the stream protocol's
CreateSuperStream. Changes are durable before the answer.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from http_gateway.context import caller, read_json_object, vhost_for
from http_gateway.errors import HttpError
from http_gateway.views import require_permission
from streamq.broker import stream_definitions
from streamq.broker.errors import NotFound

routes = web.RouteTableDef()
PATH: Final = "/api/stream/super-streams/{vhost}/{name}"


def partition_layout(name: str, body: dict[str, object]) -> tuple[list[str], list[str]]:
    """(partitions, binding keys) from the body. Raises HttpError 400."""
    count, keys = body.get("partitions"), body.get("binding_keys")
    if (count is None) == (keys is None):
        raise HttpError(400, "give partitions (a count) or binding_keys (a list), one of them")
    if keys is not None:
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise HttpError(400, "binding_keys must be a non-empty list of strings")
        return [f"{name}-{key}" for key in keys], list(keys)
    if not isinstance(count, int) or isinstance(count, bool):
        raise HttpError(400, "partitions must be an integer")
    if not 1 <= count <= stream_definitions.PARTITIONS_MAX:
        raise HttpError(400, f"partitions must be 1 to {stream_definitions.PARTITIONS_MAX}")
    return [f"{name}-{i}" for i in range(count)], [str(i) for i in range(count)]


def _arguments(body: dict[str, object]) -> dict[str, str]:
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise HttpError(400, "arguments must be an object")
    return {str(k): str(v) for k, v in arguments.items()}


@routes.put(PATH)
async def put(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = request.match_info["name"]
    body = await read_json_object(request)
    partitions, keys = partition_layout(name, body)
    arguments = stream_definitions.stream_arguments(_arguments(body))
    for resource in (name, *partitions):
        require_permission(who, vhost.name, "configure", "queue", resource)
    if name in vhost.exchanges:
        raise HttpError(409, f"super stream {name} exists in vhost {vhost.name}")
    stream_definitions.create_super_stream(vhost, name, partitions, keys, arguments)
    await vhost.sync_all()
    return web.Response(status=201)


@routes.get(PATH)
async def get(request: web.Request) -> web.Response:
    vhost = vhost_for(caller(request), request.match_info["vhost"])
    name = request.match_info["name"]
    try:
        partitions = stream_definitions.partitions(vhost, name)
    except NotFound:
        raise HttpError(404, "Object Not Found") from None
    return web.json_response({"name": name, "vhost": vhost.name, "partitions": partitions})


@routes.delete(PATH)
async def delete(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = request.match_info["name"]
    try:
        partitions = stream_definitions.partitions(vhost, name)
    except NotFound:
        raise HttpError(404, "Object Not Found") from None
    for resource in (name, *partitions):
        require_permission(who, vhost.name, "configure", "queue", resource)
    stream_definitions.delete_super_stream(vhost, name)
    await vhost.sync_all()
    return web.Response(status=204)
