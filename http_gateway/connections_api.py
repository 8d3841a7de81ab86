"""`/api/connections`, `/api/channels` and `/api/consumers`, as RabbitMQ's management API
has them.

Owns the endpoints on client connections (`Broker.clients`): list them (all, per vhost),
show one with its channels, close one or all of a user's (`DELETE`, 320
CONNECTION_FORCED with the `X-Reason` header's text, "Closed via management plugin"
without one), list channels and consumers, cancel a consumer. monitoring and
administrator users see every connection; other management users see their own only.
Closing someone else's connection or cancelling their consumer needs administrator.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from http_gateway.context import Caller, caller, vhost_for, visible_vhosts
from http_gateway.errors import HttpError
from http_gateway.listing import list_response
from http_gateway.views import (
    channel_json,
    channel_name,
    client_by_name,
    connection_json,
    consumers_of,
    sees_all_connections,
    visible_clients,
)
from streamq.broker.clients import Client

CLOSE_REASON_DEFAULT: Final = "Closed via management plugin"

routes = web.RouteTableDef()


def _shown(who: Caller, client: Client) -> dict[str, object]:
    return connection_json(client, who.broker.stats_sampler.octet_rates(client.name))


def _channels(clients: list[Client]) -> list[dict[str, object]]:
    return [channel_json(c, info) for c in clients for info in c.channels()]


@routes.get("/api/connections")
async def list_all(request: web.Request) -> web.Response:
    who = caller(request)
    return list_response(request, [_shown(who, c) for c in visible_clients(who)])


@routes.get("/api/vhosts/{vhost}/connections")
async def list_vhost(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    clients = visible_clients(who, vhost.name)
    return list_response(request, [_shown(who, c) for c in clients], pageable=False)


def _user_clients(request: web.Request) -> tuple[Caller, list[Client]]:
    """The connections of the user in the path; the user themself, monitoring (to list)
    and administrator may ask. Raises HttpError 403."""
    who = caller(request)
    user = request.match_info["user"]
    monitors = request.method == "GET" and sees_all_connections(who)
    if user != who.user.name and not (who.is_admin or monitors):
        raise HttpError(403, "Not_Authorized: connections of another user")
    return who, [c for c in visible_clients(who) if c.user == user]


@routes.get("/api/connections/username/{user}")
async def list_user(request: web.Request) -> web.Response:
    who, clients = _user_clients(request)
    return list_response(request, [_shown(who, c) for c in clients])


@routes.delete("/api/connections/username/{user}")
async def delete_user_connections(request: web.Request) -> web.Response:
    _, clients = _user_clients(request)
    reason = request.headers.get("X-Reason") or CLOSE_REASON_DEFAULT
    for client in clients:
        client.close(reason)
    return web.Response(status=204)


@routes.get("/api/connections/{name}")
async def get(request: web.Request) -> web.Response:
    who = caller(request)
    return web.json_response(_shown(who, client_by_name(who, request.match_info["name"])))


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
    return list_response(request, _channels([client]), pageable=False)


@routes.get("/api/channels")
async def channels(request: web.Request) -> web.Response:
    return list_response(request, _channels(visible_clients(caller(request))))


@routes.get("/api/vhosts/{vhost}/channels")
async def vhost_channels(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    return list_response(request, _channels(visible_clients(who, vhost.name)), pageable=False)


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
    return list_response(request, out, pageable=False)


@routes.get("/api/consumers")
async def consumers(request: web.Request) -> web.Response:
    return _consumers(request, [v.name for v in visible_vhosts(caller(request))])


@routes.get("/api/consumers/{vhost}")
async def vhost_consumers(request: web.Request) -> web.Response:
    return _consumers(request, [vhost_for(caller(request), request.match_info["vhost"]).name])


@routes.delete("/api/consumers/{vhost}/{connection}/{channel}/{tag}")
async def cancel_consumer(request: web.Request) -> web.Response:
    """Cancel a consumer: its client gets basic.cancel (consumer_cancel_notify)."""
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    client = client_by_name(who, request.match_info["connection"])
    try:
        channel = int(request.match_info["channel"])
    except ValueError:
        raise HttpError(400, "channel must be a channel number") from None
    if client.vhost != vhost.name:
        raise HttpError(404, "Object Not Found")
    if client.user != who.user.name and not who.is_admin:
        raise HttpError(403, "Not_Authorized: cancelling another user's consumer")
    if not client.cancel_consumer(channel, request.match_info["tag"]):
        raise HttpError(404, "Object Not Found")
    return web.Response(status=204)
