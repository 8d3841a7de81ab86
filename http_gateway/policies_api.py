"""`/api/policies` and `/api/operator-policies`, as RabbitMQ's management API has them.

Owns the policy endpoints: list (all vhosts, one vhost), get, put (201 when created, 204
when replaced) and delete. A policy is durable before the reply goes out. Policies need
the `policymaker` or `administrator` tag and access to the vhost; operator policies need
`administrator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from http_gateway.protocol import HttpError, Request, Response
from streamq.broker.vhost import VHost

if TYPE_CHECKING:
    from http_gateway.server import Caller

POLICY_TAGS = frozenset({"policymaker", "administrator"})


async def handle(caller: Caller, request: Request) -> Response:
    operator = request.segments[1] == "operator-policies"
    _check_tags(caller, operator)
    rest = [s for s in request.segments[2:] if s != ""] if len(request.segments) > 2 else []
    if len(rest) == 0:
        _allow(request, "GET")
        return Response(200, _list(caller, None, operator))
    vhost = _vhost(caller, rest[0])
    if len(rest) == 1:
        _allow(request, "GET")
        return Response(200, _list(caller, vhost, operator))
    if len(rest) != 2:
        raise HttpError(404, "Not Found")
    name = rest[1]
    table = vhost.operator_policies if operator else vhost.policies
    if request.method == "GET":
        policy = table.get(name)
        if policy is None:
            raise HttpError(404, "Not Found")
        return Response(200, policy.to_json(vhost.name))
    if request.method == "PUT":
        body = request.json()
        if not isinstance(body, dict):
            raise HttpError(400, "the body must be a JSON object")
        existed = name in table
        vhost.set_policy(name, body, operator=operator)
        await vhost.sync_all()
        return Response(204 if existed else 201)
    if request.method == "DELETE":
        if name not in table:
            raise HttpError(404, "Not Found")
        vhost.clear_policy(name, operator=operator)
        await vhost.sync_all()
        return Response(204)
    raise HttpError(405, f"{request.method} is not allowed here")


def _allow(request: Request, method: str) -> None:
    if request.method != method:
        raise HttpError(405, f"{request.method} is not allowed here")


def _check_tags(caller: Caller, operator: bool) -> None:
    tags = set(caller.user.tags)
    needed = {"administrator"} if operator else POLICY_TAGS
    if not tags & needed:
        raise HttpError(403, "Not_Authorized: needs the tag " + " or ".join(sorted(needed)))


def _vhost(caller: Caller, name: str) -> VHost:
    vhost = caller.broker.vhosts.get(name)
    if vhost is None:
        raise HttpError(404, f"vhost {name} not found")
    if "administrator" not in caller.user.tags and not caller.broker.accounts.vhost_access(
        caller.user.name, name
    ):
        raise HttpError(403, f"access to vhost '{name}' refused for user '{caller.user.name}'")
    return vhost


def _list(caller: Caller, vhost: VHost | None, operator: bool) -> list[dict[str, object]]:
    vhosts = [vhost] if vhost is not None else list(caller.broker.vhosts.values())
    out = []
    for each in vhosts:
        hidden = vhost is None and "administrator" not in caller.user.tags
        if hidden and not caller.broker.accounts.vhost_access(caller.user.name, each.name):
            continue
        table = each.operator_policies if operator else each.policies
        out += [p.to_json(each.name) for p in sorted(table.values(), key=lambda p: p.name)]
    return out
