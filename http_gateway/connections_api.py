"""`/api/connections`, `/api/channels` and `/api/consumers`, as RabbitMQ's management API
has them.

Owns the endpoints on client connections (`Broker.clients`): list them (all, per vhost),
show one with its channels, close one (`DELETE`, 320 CONNECTION_FORCED with the
`X-Reason` header's text, "Closed via management plugin" without one), list channels and
consumers. monitoring and administrator users see every connection; other management
users see their own only. Closing someone else's connection needs administrator.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from http_gateway.context import caller, vhost_for, visible_vhosts
from http_gateway.errors import HttpError
from http_gateway.views import (
    channel_json,
    channel_name,
    client_by_name,
    connection_json,
    consumers_of,
    visible_clients,
)
from streamq.broker.clients import Client

CLOSE_REASON_DEFAULT: Final = "Closed via management plugin"

routes = web.RouteTableDef()


def _channels(clients: list[Client]) -> list[dict[str, object]]:
    return [channel_json(c, info) for c in clients for info in c.channels()]


@routes.get("/api/connections")
async def list_all(request: web.Request) -> web.Response:
    return web.json_response([connection_json(c) for c in visible_clients(caller(request))])


@routes.get("/api/vhosts/{vhost}/connections")
async def list_vhost(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    return web.json_response([connection_json(c) for c in visible_clients(who, vhost.name)])


@routes.get("/api/connections/{name}")
async def get(request: web.Request) -> web.Response:
    client = client_by_name(caller(request), request.match_info["name"])
    return web.json_response(connection_json(client))


@routes.delete("/api/connections/{name}")
async def delete(request: web.Request) -> web.Response:
    who = caller(request)
    client = client_by_name(who, request.match_info["name"])
    if client.user != who.user.name and not who.is_admin:
        raise HttpError(403, "Not_Authorized: closing another user's connection")
    client.close(request.headers.get("X-Reason") or CLOSE_REASON_DEFAULT)
    return web.Response(status=204)


@routes.get("/api/connections/{name}/channels")
async def connection_channels(request: web.Request) -> web.Response:
    client = client_by_name(caller(request), request.match_info["name"])
    return web.json_response(_channels([client]))


@routes.get("/api/channels")
async def channels(request: web.Request) -> web.Response:
    return web.json_response(_channels(visible_clients(caller(request))))


@routes.get("/api/vhosts/{vhost}/channels")
async def vhost_channels(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    return web.json_response(_channels(visible_clients(who, vhost.name)))


@routes.get("/api/channels/{name}")
async def channel(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    for client in visible_clients(caller(request)):
        for info in client.channels():
            if channel_name(client, info.number) == name:
                return web.json_response(channel_json(client, info))
    raise HttpError(404, "Object Not Found")


def _consumers(request: web.Request, vhosts: list[str]) -> web.Response:
    who = caller(request)
    visible = {c.name for c in visible_clients(who)}
    out = []
    for vhost in vhosts:
        for _, found in sorted(consumers_of(who.broker, vhost).items()):
            out += [
                c
                for c in found
                if isinstance(c["channel_details"], dict)
                and c["channel_details"]["connection_name"] in visible
            ]
    return web.json_response(out)


@routes.get("/api/consumers")
async def consumers(request: web.Request) -> web.Response:
    return _consumers(request, [v.name for v in visible_vhosts(caller(request))])


@routes.get("/api/consumers/{vhost}")
async def vhost_consumers(request: web.Request) -> web.Response:
    return _consumers(request, [vhost_for(caller(request), request.match_info["vhost"]).name])
