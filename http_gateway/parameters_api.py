"""`/api/parameters` and `/api/vhost-limits`, as far as streamq has them.

Owns RabbitMQ's runtime-parameter and vhost-limit paths, which rabbitmqadmin lists and
declares through (`list parameters`, `declare parameter`, `list vhost_limits`, ...).
streamq's runtime parameters are those of the shovel and federation components
("shovel", "federation-upstream", "federation-upstream-set"), kept per vhost by
`VHost.parameters` (validated there: a bad value is RabbitMQ's 400 "Validation failed"
and changes nothing), and operator policies: RabbitMQ stores them as parameters of
component `operator_policy`, and lists and exports them so, and so does streamq
(`parameter_json`, also used by the definitions export); they are read, set and cleared
here as through `/api/operator-policies`, by administrators. Setting a parameter of
another component is the 400 RabbitMQ answers for a plugin that is not enabled.
streamq has no vhost limits: the lists are empty and setting one is a 400.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from http_gateway.context import (
    ADMIN_TAGS,
    Caller,
    administrator,
    caller,
    read_json_object,
    require_tags,
    vhost_for,
    visible_vhosts,
)
from http_gateway.errors import HttpError
from http_gateway.listing import list_response
from streamq.broker.definitions_import import OPERATOR_POLICY_COMPONENT
from streamq.broker.errors import NotFound
from streamq.broker.link_definitions import COMPONENTS, ParameterInvalid
from streamq.broker.policies import Policy, PolicyInvalid
from streamq.broker.vhost import VHost

PARAMETER_TAGS: Final = frozenset({"policymaker", "administrator"})  # as RabbitMQ's
KNOWN_COMPONENTS: Final = (OPERATOR_POLICY_COMPONENT, *COMPONENTS)

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


def vhost_parameters(
    vhost: VHost, component: str | None, *, admin: bool
) -> list[dict[str, object]]:
    """The parameters of `component` (None: all) of one vhost, by component and name:
    operator policies for administrators only (as `/api/operator-policies`)."""
    found: list[dict[str, object]] = []
    if component in (None, *COMPONENTS):
        found += [p.to_json() for p in vhost.parameters.list(component)]
    if component in (None, OPERATOR_POLICY_COMPONENT) and admin:
        found += [parameter_json(vhost.name, p) for _, p in sorted(vhost.operator_policies.items())]
    return sorted(found, key=lambda p: (str(p["component"]), str(p["name"])))


def _parameters(who: Caller, vhosts: list[VHost], component: str | None) -> list[dict[str, object]]:
    return [p for v in vhosts for p in vhost_parameters(v, component, admin=who.is_admin)]


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
    if component == OPERATOR_POLICY_COMPONENT:
        require_tags(who, ADMIN_TAGS)
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
    _, vhost, component, name = _target(request)
    if component not in KNOWN_COMPONENTS:
        raise HttpError(404, "Not Found")
    try:
        if component == OPERATOR_POLICY_COMPONENT:
            vhost.clear_policy(name, operator=True)
        else:
            vhost.parameters.delete(component, name)
    except NotFound:
        raise HttpError(404, "Not Found") from None
    await vhost.sync_all()
    return web.Response(status=204)


# -- vhost limits --------------------------------------------------------------------------


@routes.get("/api/vhost-limits")
async def list_limits(request: web.Request) -> web.Response:
    return list_response(request, [], pageable=False)


@routes.get("/api/vhost-limits/{vhost}")
async def vhost_limits(request: web.Request) -> web.Response:
    vhost_for(caller(request), request.match_info["vhost"])
    return list_response(request, [], pageable=False)


@routes.put("/api/vhost-limits/{vhost}/{name}")
async def put_limit(request: web.Request) -> web.Response:
    who = administrator(request)
    vhost_for(who, request.match_info["vhost"])
    raise HttpError(400, f"streamq has no vhost limits: {request.match_info['name']} not set")


@routes.delete("/api/vhost-limits/{vhost}/{name}")
async def delete_limit(request: web.Request) -> web.Response:
    """As RabbitMQ's clearing of a limit that is not set: 204, nothing changes."""
    who = administrator(request)
    vhost_for(who, request.match_info["vhost"])
    return web.Response(status=204)
