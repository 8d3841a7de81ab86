"""`/api/shovels` and `/api/federation-links`: the status of shovels and federation links,
as RabbitMQ's shovel and federation management plugins (and LavinMQ) show them.

Owns the status routes over `Broker.links` (what the links runtime registered: it builds
each entry, `Link.status()`) and the operations on one shovel: RabbitMQ's restart
(`DELETE /api/shovels/vhost/{vhost}/{name}/restart`) and delete, LavinMQ's pause and
resume (`PUT .../pause`, `.../resume`). A shovel parameter the runtime has not
registered (yet) is listed "starting" from its definition, so that what was just added
shows at once. Management users see the links of the vhosts they may see; acting on a
shovel needs policymaker or administrator, as setting its parameter does.
"""

from __future__ import annotations

from aiohttp import web

from http_gateway.context import Caller, caller, require_tags, vhost_for, visible_vhosts
from http_gateway.errors import HttpError
from http_gateway.listing import list_response
from http_gateway.parameters_api import PARAMETER_TAGS
from http_gateway.views import NODE
from streamq.broker.link_definitions import SHOVEL as SHOVEL_COMPONENT
from streamq.broker.link_definitions import ShovelDefinition, shovel_ends
from streamq.broker.links import FEDERATION, SHOVEL, Link, link_key
from streamq.broker.parameters import Parameter
from streamq.broker.vhost import VHost

routes = web.RouteTableDef()


def link_json(link: Link) -> dict[str, object]:
    """The runtime's status of a link, with the fields every entry has."""
    shown: dict[str, object] = {"node": NODE, "vhost": link.vhost, "name": link.name}
    shown.update(link.status())
    shown.setdefault("state" if link.kind == SHOVEL else "status", link.state)
    shown.setdefault("transferred", link.transferred)
    shown.setdefault("error", link.error)
    if link.kind == SHOVEL:
        shown.setdefault("type", "dynamic")
        shown.setdefault("message_count", link.transferred)  # LavinMQ's name of it
    return shown


def _ends(definition: ShovelDefinition) -> dict[str, object]:
    return {
        **shovel_ends(definition),
        "src_protocol": definition.src_protocol,
        "dest_protocol": definition.dest_protocol,
    }


def pending_shovel_json(parameter: Parameter) -> dict[str, object]:
    """A shovel parameter the runtime has not registered: "starting"."""
    assert isinstance(parameter.definition, ShovelDefinition)
    return {
        "node": NODE,
        "vhost": parameter.vhost,
        "name": parameter.name,
        "type": "dynamic",
        "state": "starting",
        **_ends(parameter.definition),
        "transferred": 0,
        "message_count": 0,
        "error": "",
        "timestamp": None,
    }


def shovels_of(who: Caller, vhost: VHost) -> list[dict[str, object]]:
    """The vhost's shovels by name: those the runtime registered, and parameters it has
    not registered (yet) as "starting"."""
    shown = {
        name: link_json(link)
        for (kind, vhost_name, name), link in who.broker.links.items()
        if kind == SHOVEL and vhost_name == vhost.name
    }
    for parameter in vhost.parameters.list(SHOVEL_COMPONENT):
        if parameter.name not in shown:
            shown[parameter.name] = pending_shovel_json(parameter)
    return [entry for _, entry in sorted(shown.items())]


def federation_links_of(who: Caller, vhost: VHost) -> list[dict[str, object]]:
    links = [
        link
        for (kind, name, _), link in sorted(who.broker.links.items())
        if kind == FEDERATION and name == vhost.name
    ]
    return [link_json(link) for link in links]


@routes.get("/api/shovels")
async def list_shovels(request: web.Request) -> web.Response:
    who = caller(request)
    found = [s for v in visible_vhosts(who) for s in shovels_of(who, v)]
    return list_response(request, found, pageable=False)


@routes.get("/api/shovels/{vhost}")
async def list_vhost_shovels(request: web.Request) -> web.Response:
    who = caller(request)
    return list_response(
        request, shovels_of(who, vhost_for(who, request.match_info["vhost"])), pageable=False
    )


@routes.get("/api/shovels/vhost/{vhost}/{name}")
@routes.get("/api/shovels/{vhost}/{name}")
async def get_shovel(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = request.match_info["name"]
    for shown in shovels_of(who, vhost):
        if shown["name"] == name:
            return web.json_response(shown)
    raise HttpError(404, f"no shovel '{name}' in vhost '{vhost.name}'")


@routes.delete("/api/shovels/vhost/{vhost}/{name}")
async def delete_shovel(request: web.Request) -> web.Response:
    """RabbitMQ's delete of a dynamic shovel: its parameter goes."""
    who = caller(request)
    require_tags(who, PARAMETER_TAGS)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = request.match_info["name"]
    if vhost.parameters.parameter(SHOVEL_COMPONENT, name) is None:
        raise HttpError(404, f"no shovel '{name}' in vhost '{vhost.name}'")
    vhost.parameters.delete(SHOVEL_COMPONENT, name)
    await vhost.sync_all()
    return web.Response(status=204)


def _running(request: web.Request) -> Link:
    """The registered link of a shovel the caller may act on; 404 when the runtime runs
    none (yet)."""
    who = caller(request)
    require_tags(who, PARAMETER_TAGS)
    vhost = vhost_for(who, request.match_info["vhost"])
    name = request.match_info["name"]
    link = who.broker.links.get(link_key(SHOVEL, vhost.name, name))
    if link is None:
        raise HttpError(404, f"shovel '{name}' in vhost '{vhost.name}' is not running")
    return link


@routes.delete("/api/shovels/vhost/{vhost}/{name}/restart")
async def restart_shovel(request: web.Request) -> web.Response:
    _running(request).restart()
    return web.Response(status=204)


@routes.put("/api/shovels/vhost/{vhost}/{name}/pause")
@routes.put("/api/shovels/{vhost}/{name}/pause")
async def pause_shovel(request: web.Request) -> web.Response:
    _running(request).pause()
    return web.Response(status=204)


@routes.put("/api/shovels/vhost/{vhost}/{name}/resume")
@routes.put("/api/shovels/{vhost}/{name}/resume")
async def resume_shovel(request: web.Request) -> web.Response:
    _running(request).resume()
    return web.Response(status=204)


@routes.get("/api/federation-links")
async def list_federation_links(request: web.Request) -> web.Response:
    who = caller(request)
    found = [s for v in visible_vhosts(who) for s in federation_links_of(who, v)]
    return list_response(request, found, pageable=False)


@routes.get("/api/federation-links/{vhost}")
async def list_vhost_federation_links(request: web.Request) -> web.Response:
    who = caller(request)
    vhost = vhost_for(who, request.match_info["vhost"])
    return list_response(request, federation_links_of(who, vhost), pageable=False)
