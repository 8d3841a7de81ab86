"""`/api/vhost-limits` and `/api/user-limits`, as RabbitMQ 3.10's management plugin has
them (rabbit_mgmt_wm_limit[s], rabbit_mgmt_wm_user_limit[s]).

Owns the limit endpoints: listing (any management user; vhost limits of the vhosts it may
see), and PUT `{"value": N}` / DELETE of one limit by administrators, with RabbitMQ's
answers: 204 either way, `not_json` and `[{key_missing,value}]` for a bad body, the
validation texts of streamq/broker/account_limits.py, `vhost_not_found` and
`["no_such_user", name]` for a missing vhost or user. A DELETE for a missing vhost or user
is a 404 where RabbitMQ answers 500. A vhost whose last limit was cleared keeps its empty
parameter, which the full listing shows as `[]` (RabbitMQ's). Changes are durable before
the reply (the account store fsyncs, in a worker thread); what they change on the wire is
streamq/broker/connection_tracking.py's and the queue.declare check.
"""

from __future__ import annotations

from aiohttp import web

from http_gateway.context import (
    BODY_BYTES_MAX,
    Caller,
    administrator,
    caller,
    may_see,
)
from http_gateway.errors import HttpError
from http_gateway.listing import list_response
from streamq.broker import json_text
from streamq.broker.account_limits import Limits, check_user_limits

routes = web.RouteTableDef()

NOT_FOUND = "Not Found"
DOUBLY_ENCODED = (  # rabbit_mgmt_util's answer to a body that decodes to a string
    "invalid payload: the request body JSON-decoded to a string. Is the input doubly-JSON-encoded?"
)


def vhost_limits_json(vhost: str, limits: Limits) -> dict[str, object]:
    """One vhost's entry; an empty parameter is `[]`, as RabbitMQ's (an empty proplist)."""
    return {"vhost": vhost, "value": dict(limits) if limits else []}


def user_limits_json(user: str, limits: Limits) -> dict[str, object]:
    return {"user": user, "value": dict(limits)}


def _known_vhost(who: Caller, name: str) -> str:
    """`name` if it exists and the caller may see it: 404 or 403 otherwise."""
    if not who.broker.accounts.has_vhost(name):
        raise HttpError(404, NOT_FOUND)
    if not may_see(who, name):
        raise HttpError(403, f"access to vhost '{name}' refused for user '{who.user.name}'")
    return name


async def _value(request: web.Request) -> object:
    """The body's "value", read as rabbit_mgmt_util:with_decode/4 reads it."""
    if request.content_length is not None and request.content_length > BODY_BYTES_MAX:
        raise HttpError(413, f"bodies are at most {BODY_BYTES_MAX} bytes")
    try:
        body = json_text.loads(await request.read())
    except ValueError:
        raise HttpError(400, "not_json") from None
    if isinstance(body, str):
        raise HttpError(400, DOUBLY_ENCODED)
    if not isinstance(body, dict):
        raise HttpError(400, "not_json")
    if "value" not in body:
        raise HttpError(400, "[{key_missing,value}]")
    return body["value"]


# -- vhost limits --------------------------------------------------------------------------


@routes.get("/api/vhost-limits")
async def list_vhost_limits(request: web.Request) -> web.Response:
    who = caller(request)
    found = [
        vhost_limits_json(vhost, limits)
        for vhost, limits in who.broker.accounts.list_vhost_limits()
        if may_see(who, vhost)
    ]
    return list_response(request, found, pageable=False)


@routes.get("/api/vhost-limits/{vhost}")
async def vhost_limits(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = _known_vhost(who, request.match_info["vhost"])
    limits = who.broker.accounts.vhost_limits(vhost)
    found = [vhost_limits_json(vhost, limits)] if limits else []
    return list_response(request, found, pageable=False)


@routes.put("/api/vhost-limits/{vhost}/{name}")
async def put_vhost_limit(request: web.Request) -> web.Response:
    who = administrator(request)
    vhost = request.match_info["vhost"]
    accounts = who.broker.accounts
    if not accounts.has_vhost(vhost):
        raise HttpError(404, "vhost_not_found", kind="not_found")
    value = await _value(request)
    name = request.match_info["name"]
    await who.broker.change_durably(accounts.update_vhost_limit, vhost, name, value)
    return web.Response(status=204)


@routes.delete("/api/vhost-limits/{vhost}/{name}")
async def delete_vhost_limit(request: web.Request) -> web.Response:
    who = administrator(request)
    vhost = request.match_info["vhost"]
    accounts = who.broker.accounts
    if not accounts.has_vhost(vhost):
        raise HttpError(404, NOT_FOUND)
    name = request.match_info["name"]
    await who.broker.change_durably(accounts.clear_vhost_limit, vhost, name)
    return web.Response(status=204)


# -- user limits ---------------------------------------------------------------------------


@routes.get("/api/user-limits")
async def list_user_limits(request: web.Request) -> web.Response:
    accounts = caller(request).broker.accounts
    found = [user_limits_json(user, limits) for user, limits in accounts.list_user_limits()]
    return list_response(request, found, pageable=False)


@routes.get("/api/user-limits/{user}")
async def user_limits(request: web.Request) -> web.Response:
    accounts = caller(request).broker.accounts
    user = request.match_info["user"]
    if accounts.user(user) is None:
        raise HttpError(404, NOT_FOUND)
    limits = accounts.user_limits(user)
    found = [user_limits_json(user, limits)] if limits else []
    return list_response(request, found, pageable=False)


@routes.put("/api/user-limits/{user}/{name}")
async def put_user_limit(request: web.Request) -> web.Response:
    who = administrator(request)
    user = request.match_info["user"]
    accounts = who.broker.accounts
    limits = {request.match_info["name"]: await _value(request)}
    if accounts.user(user) is None:
        check_user_limits(limits)  # RabbitMQ validates first, then meets the missing user
        raise HttpError(400, ["no_such_user", user])
    await who.broker.change_durably(accounts.set_user_limits, user, limits)
    return web.Response(status=204)


@routes.delete("/api/user-limits/{user}/{name}")
async def delete_user_limit(request: web.Request) -> web.Response:
    who = administrator(request)
    user = request.match_info["user"]
    accounts = who.broker.accounts
    if accounts.user(user) is None:
        raise HttpError(404, NOT_FOUND)
    name = request.match_info["name"]
    await who.broker.change_durably(accounts.clear_user_limit, user, name)
    return web.Response(status=204)
