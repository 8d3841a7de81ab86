"""`/api/topic-permissions` and the per-user and per-vhost lists, as RabbitMQ 3.10 has
them (rabbit_mgmt_wm_topic_permissions*).

Owns the topic permission endpoints: all of them, a user's in a vhost (GET lists one entry
per exchange; PUT sets one exchange's from `{"exchange", "write", "read"}`, 201 for the
pair's first and 204 after; DELETE clears all of the pair's, as RabbitMQ 3.10, which
ignores an exchange given), by user and by vhost. Every one needs `administrator`.
Changes are durable before the reply (the account store fsyncs, in a worker thread).
"""

from __future__ import annotations

from aiohttp import web

from http_gateway.context import Caller, administrator, read_json_object
from http_gateway.errors import HttpError
from http_gateway.listing import list_response
from streamq.broker.topic_permissions import TopicPermission

routes = web.RouteTableDef()
BODY_KEYS = ("exchange", "write", "read")


def topic_permission_json(topic: TopicPermission) -> dict[str, object]:
    return {
        "user": topic.user,
        "vhost": topic.vhost,
        "exchange": topic.exchange,
        "write": topic.write,
        "read": topic.read,
    }


@routes.get("/api/topic-permissions")
async def list_all(request: web.Request) -> web.Response:
    accounts = administrator(request).broker.accounts
    found = [topic_permission_json(t) for t in accounts.list_topic_permissions()]
    return list_response(request, found, pageable=False)


@routes.get("/api/users/{user}/topic-permissions")
async def of_user(request: web.Request) -> web.Response:
    accounts = administrator(request).broker.accounts
    user = request.match_info["user"]
    if accounts.user(user) is None:
        raise HttpError(404, "Not Found")
    found = accounts.list_topic_permissions(user=user)
    return web.json_response([topic_permission_json(t) for t in found])


@routes.get("/api/vhosts/{vhost}/topic-permissions")
async def on_vhost(request: web.Request) -> web.Response:
    accounts = administrator(request).broker.accounts
    vhost = request.match_info["vhost"]
    if not accounts.has_vhost(vhost):
        raise HttpError(404, "Not Found")
    found = accounts.list_topic_permissions(vhost=vhost)
    return web.json_response([topic_permission_json(t) for t in found])


PAIR = "/api/topic-permissions/{vhost}/{user}"


def _pair(who: Caller, request: web.Request) -> tuple[str, str, list[TopicPermission] | None]:
    """The vhost and user of the path and their topic permissions; None when the user or
    vhost does not exist (RabbitMQ's `not_found`)."""
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    accounts = who.broker.accounts
    if accounts.user(user) is None or not accounts.has_vhost(vhost):
        return vhost, user, None
    return vhost, user, accounts.list_topic_permissions(user=user, vhost=vhost)


@routes.get(PAIR)
async def get_pair(request: web.Request) -> web.Response:
    _, _, found = _pair(administrator(request), request)
    if not found:
        raise HttpError(404, "Not Found")
    return web.json_response([topic_permission_json(t) for t in found])


def parse_topic_permission(body: dict[str, object]) -> tuple[str, str, str]:
    """exchange, write and read of a PUT body. Raises HttpError 400 as RabbitMQ words it."""
    missing = [key for key in BODY_KEYS if key not in body]
    if missing:
        raise HttpError(400, "[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")
    wrong = [key for key in BODY_KEYS if not isinstance(body[key], str)]
    if wrong:
        raise HttpError(400, f"{', '.join(wrong)} must be a string")
    exchange, write, read = (str(body[key]) for key in BODY_KEYS)
    return exchange, write, read


@routes.put(PAIR)
async def put_pair(request: web.Request) -> web.Response:
    who = administrator(request)
    vhost, user, found = _pair(who, request)
    body = await read_json_object(request)
    if found is None:
        raise HttpError(400, "vhost_or_user_not_found")
    exchange, write, read = parse_topic_permission(body)
    accounts = who.broker.accounts
    await who.broker.change_durably(
        accounts.set_topic_permissions, user, vhost, exchange, write, read
    )
    return web.Response(status=204 if found else 201)


@routes.delete(PAIR)
async def delete_pair(request: web.Request) -> web.Response:
    who = administrator(request)
    vhost, user, found = _pair(who, request)
    if not found:
        raise HttpError(404, "Not Found")
    await who.broker.change_durably(who.broker.accounts.clear_topic_permissions, user, vhost)
    return web.Response(status=204)
