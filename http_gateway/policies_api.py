"""`/api/policies` and `/api/operator-policies`, as RabbitMQ's management API has them.

Owns the policy endpoints: list (all vhosts, one vhost), get, put (201 when created, 204
when replaced) and delete. A policy is durable before the reply goes out. Policies need
the `policymaker` or `administrator` tag and access to the vhost; operator policies need
`administrator`.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from http_gateway.context import (
    Caller,
    caller,
    read_json_object,
    require_tags,
    vhost_for,
    visible_vhosts,
)
from http_gateway.errors import HttpError
from http_gateway.listing import list_response
from streamq.broker.vhost import VHost

POLICY_TAGS: Final = frozenset({"policymaker", "administrator"})
OPERATOR_TAGS: Final = frozenset({"administrator"})

routes = web.RouteTableDef()


def _caller(request: web.Request) -> tuple[Caller, bool]:
    operator = request.match_info["kind"] == "operator-policies"
    who = caller(request)
    require_tags(who, OPERATOR_TAGS if operator else POLICY_TAGS)
    return who, operator


def _policies(vhosts: list[VHost], operator: bool) -> list[dict[str, object]]:
    out = []
    for each in vhosts:
        table = each.operator_policies if operator else each.policies
        out += [p.to_json(each.name) for p in sorted(table.values(), key=lambda p: p.name)]
    return out


@routes.get(r"/api/{kind:policies|operator-policies}")
async def list_all(request: web.Request) -> web.Response:
    who, operator = _caller(request)
    return list_response(request, _policies(visible_vhosts(who), operator), pageable=False)


@routes.get(r"/api/{kind:policies|operator-policies}/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    who, operator = _caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    return list_response(request, _policies([vhost], operator), pageable=False)


def _table(request: web.Request) -> tuple[VHost, bool, str]:
    who, operator = _caller(request)
    return vhost_for(who, request.match_info["vhost"]), operator, request.match_info["name"]


@routes.get(r"/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def get(request: web.Request) -> web.Response:
    vhost, operator, name = _table(request)
    policy = (vhost.operator_policies if operator else vhost.policies).get(name)
    if policy is None:
        raise HttpError(404, "Not Found")
    return web.json_response(policy.to_json(vhost.name))


@routes.put(r"/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def put(request: web.Request) -> web.Response:
    vhost, operator, name = _table(request)
    body = await read_json_object(request)
    existed = name in (vhost.operator_policies if operator else vhost.policies)
    vhost.set_policy(name, body, operator=operator)
    await vhost.sync_all()
    return web.Response(status=204 if existed else 201)


@routes.delete(r"/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    vhost, operator, name = _table(request)
    if name not in (vhost.operator_policies if operator else vhost.policies):
        raise HttpError(404, "Not Found")
    vhost.clear_policy(name, operator=operator)
    await vhost.sync_all()
    return web.Response(status=204)
