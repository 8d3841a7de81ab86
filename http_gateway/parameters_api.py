"""`/api/parameters`, as far as streamq has them.

Owns RabbitMQ's runtime-parameter paths, which rabbitmqadmin lists and declares through
(`list parameters`, `declare parameter`, ...).
streamq's runtime parameters are those of the shovel and federation components
("shovel", "federation-upstream", "federation-upstream-set"), kept per vhost by
`VHost.parameters` (validated there: a bad value is RabbitMQ's 400 "Validation failed"
and changes nothing), and operator policies: RabbitMQ stores them as parameters of
component `operator_policy`, and lists and exports them so, and so does streamq
(`parameter_json`, also used by the definitions export); they are read, set and cleared
here as through `/api/operator-policies`, by administrators. A vhost's limits are
RabbitMQ's parameter `vhost-limits`/`limits` (streamq/broker/account_limits.py, kept in the
accounts): listed, exported, set and cleared here too (other names of that component are
a 400 where RabbitMQ crashes with a 500). Setting a parameter of another component is the
400 RabbitMQ answers for a plugin that is not enabled.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from http_gateway.context import (
    ADMIN_TAGS,
    Caller,
    caller,
    read_json_object,
    require_tags,
    vhost_for,
    visible_vhosts,
)
from http_gateway.errors import HttpError
from http_gateway.listing import list_response
from streamq.broker.account_limits import (
    VHOST_COMPONENT,
    VHOST_PARAMETER,
    LimitInvalid,
    Limits,
    check_vhost_limits,
)
from streamq.broker.definitions_import import OPERATOR_POLICY_COMPONENT
from streamq.broker.errors import NotFound
from streamq.broker.link_definitions import COMPONENTS, ParameterInvalid
from streamq.broker.policies import Policy, PolicyInvalid
from streamq.broker.vhost import VHost

PARAMETER_TAGS: Final = frozenset({"policymaker", "administrator"})  # as RabbitMQ's
KNOWN_COMPONENTS: Final = (OPERATOR_POLICY_COMPONENT, VHOST_COMPONENT, *COMPONENTS)

routes = web.RouteTableDef()


def parameter_json(vhost: str, policy: Policy) -> dict[str, object]:
    """An operator policy as RabbitMQ shows it among runtime parameters."""
    value = {k: v for k, v in policy.to_json(vhost).items() if k not in ("vhost", "name")}
    return {
        "value": value,
        "vhost": vhost,
        "component": OPERATOR_POLICY_COMPONENT,
        "name": policy.name,
    }


def limits_parameter_json(vhost: str, limits: Limits) -> dict[str, object]:
    """A vhost's limits as RabbitMQ lists and exports its `vhost-limits` parameter (an
    empty one's value is `[]`, an empty Erlang proplist)."""
    return {
        "value": dict(limits) if limits else [],
        "vhost": vhost,
        "component": VHOST_COMPONENT,
        "name": VHOST_PARAMETER,
    }


def vhost_parameters(
    vhost: VHost, component: str | None, *, admin: bool, limits: Limits | None = None
) -> list[dict[str, object]]:
    """The parameters of `component` (None: all) of one vhost, by component and name:
    operator policies for administrators only (as `/api/operator-policies`); `limits`,
    the vhost's `vhost-limits` parameter if it has one."""
    found: list[dict[str, object]] = []
    if component in (None, *COMPONENTS):
        found += [p.to_json() for p in vhost.parameters.list(component)]
    if component in (None, VHOST_COMPONENT) and limits is not None:
        found.append(limits_parameter_json(vhost.name, limits))
    if component in (None, OPERATOR_POLICY_COMPONENT) and admin:
        found += [parameter_json(vhost.name, p) for _, p in sorted(vhost.operator_policies.items())]
    return sorted(found, key=lambda p: (str(p["component"]), str(p["name"])))


def _parameters(who: Caller, vhosts: list[VHost], component: str | None) -> list[dict[str, object]]:
    limits = who.broker.accounts.vhost_limits
    return [
        p
        for v in vhosts
        for p in vhost_parameters(v, component, admin=who.is_admin, limits=limits(v.name))
    ]


def _caller(request: web.Request) -> Caller:
    who = caller(request)
    require_tags(who, PARAMETER_TAGS)
    return who


@routes.get("/api/parameters")
async def list_all(request: web.Request) -> web.Response:
    who = _caller(request)
    return list_response(request, _parameters(who, visible_vhosts(who), None), pageable=False)


@routes.get("/api/parameters/{component}")
async def list_component(request: web.Request) -> web.Response:
    who = _caller(request)
    found = _parameters(who, visible_vhosts(who), request.match_info["component"])
    return list_response(request, found, pageable=False)


@routes.get("/api/parameters/{component}/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    who = _caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    found = _parameters(who, [vhost], request.match_info["component"])
    return list_response(request, found, pageable=False)


def _target(request: web.Request) -> tuple[Caller, VHost, str, str]:
    """Who asks, and the vhost, component and name of a parameter path: 403 for a caller
    who may not touch it (operator policies: administrators)."""
    who = _caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    component = request.match_info["component"]
    if component in (OPERATOR_POLICY_COMPONENT, VHOST_COMPONENT):
        require_tags(who, ADMIN_TAGS)  # as their own paths (RabbitMQ: any policymaker)
    return who, vhost, component, request.match_info["name"]


@routes.get("/api/parameters/{component}/{vhost}/{name}")
async def get(request: web.Request) -> web.Response:
    who = _caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = request.match_info["name"]
    for found in _parameters(who, [vhost], request.match_info["component"]):
        if found["name"] == name:
            return web.json_response(found)
    raise HttpError(404, "Not Found")


def _validation_failed(reason: object) -> HttpError:
    """RabbitMQ's 400 for a value its component refuses."""
    return HttpError(400, f"Validation failed\n\n{reason}\n")


@routes.put("/api/parameters/{component}/{vhost}/{name}")
async def put(request: web.Request) -> web.Response:
    who, vhost, component, name = _target(request)
    if component not in KNOWN_COMPONENTS:
        raise _validation_failed(f"component {component} not found")
    value = (await read_json_object(request)).get("value")
    if component == VHOST_COMPONENT:
        return await _put_limits(who, vhost, name, value)
    if component == OPERATOR_POLICY_COMPONENT:
        if not isinstance(value, dict):
            raise HttpError(400, "value must be an object: the policy's pattern, definition, ...")
        existed = name in vhost.operator_policies
        vhost.set_policy(name, value, operator=True)
    else:
        try:
            existed = not vhost.parameters.put(component, name, value, who.user.name)
        except (ParameterInvalid, PolicyInvalid) as exc:
            raise _validation_failed(exc) from None
    await vhost.sync_all()
    return web.Response(status=204 if existed else 201)


@routes.delete("/api/parameters/{component}/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    who, vhost, component, name = _target(request)
    if component not in KNOWN_COMPONENTS:
        raise HttpError(404, "Not Found")
    if component == VHOST_COMPONENT:
        if name != VHOST_PARAMETER or who.broker.accounts.vhost_limits(vhost.name) is None:
            raise HttpError(404, "Not Found")
        await who.broker.change_durably(who.broker.accounts.set_vhost_limits, vhost.name, None)
        return web.Response(status=204)
    try:
        if component == OPERATOR_POLICY_COMPONENT:
            vhost.clear_policy(name, operator=True)
        else:
            vhost.parameters.delete(component, name)
    except NotFound:
        raise HttpError(404, "Not Found") from None
    await vhost.sync_all()
    return web.Response(status=204)


async def _put_limits(who: Caller, vhost: VHost, name: str, value: object) -> web.Response:
    """PUT of the whole `vhost-limits` parameter (`rabbitmqctl set_vhost_limits` sets it
    so): 204 whether it existed or not, as RabbitMQ answers."""
    if name != VHOST_PARAMETER:
        raise _validation_failed(f"{VHOST_COMPONENT} has one parameter, '{VHOST_PARAMETER}'")
    try:
        limits = check_vhost_limits(value)
    except LimitInvalid as exc:
        raise HttpError(400, str(exc)) from None
    await who.broker.change_durably(who.broker.accounts.set_vhost_limits, vhost.name, limits)
    return web.Response(status=204)
