"""`/api/definitions[/{vhost}]`: export and import in RabbitMQ's definitions JSON format.

Owns the translation between the broker's state and RabbitMQ's definitions document
(`rabbit_version`, users with `password_hash` + `hashing_algorithm`, vhosts, permissions, topic
permissions,
policies, operator policies as `parameters` of component `operator_policy` beside those of
shovels and federation upstreams, queues,
exchanges, bindings). Export lists what survives a restart: durable exchanges (not the
predeclared ones), durable non-exclusive queues and the bindings between them. Import is
`streamq.broker.definitions_import` (shared with the boot-time `load_definitions`): it is
idempotent and durable before the reply; a malformed document is a 400. All routes need
`administrator`.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from aiohttp import web

from http_gateway.context import Caller, administrator, read_json_object
from http_gateway.errors import HttpError
from http_gateway.parameters_api import vhost_parameters
from http_gateway.topic_permissions_api import topic_permission_json
from streamq import __version__
from streamq.broker.account_limits import Limits
from streamq.broker.account_values import NO_METADATA
from streamq.broker.accounts import VHostMetadata
from streamq.broker.broker import Broker
from streamq.broker.definitions_import import Importer
from streamq.broker.users import HASHING_ALGORITHM
from streamq.broker.vhost import VHost
from streamq.broker.vhost_store import PREDECLARED_NAMES

routes = web.RouteTableDef()

Entry = dict[str, object]


# -- export --------------------------------------------------------------------------------


def json_value(value: object) -> object:
    """An AMQP field value as JSON (byte strings as text, decimals as numbers)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def _arguments(arguments: Mapping[str, object]) -> dict[str, object]:
    return {str(k): json_value(v) for k, v in arguments.items()}


def vhost_entities(vhost: VHost, with_vhost: bool, limits: Limits | None) -> dict[str, list[Entry]]:
    """The parameters (`limits`, the vhost's limits, among them as RabbitMQ exports them),
    policies, operator policies, queues, exchanges and bindings that survive a restart, as
    RabbitMQ exports them (`vhost` keys only in a whole-broker export)."""
    tag: Entry = {"vhost": vhost.name} if with_vhost else {}
    queues = [q for _, q in sorted(vhost.queues.items()) if q.persisted]
    exchanges = [
        e
        for _, e in sorted(vhost.exchanges.items())
        if e.durable and e.name not in PREDECLARED_NAMES
    ]
    bindings: list[Entry] = []
    for _, exchange in sorted(vhost.exchanges.items()):
        if exchange.name == "" or not exchange.durable:
            continue
        for binding in sorted(exchange.bindings, key=lambda b: (b.destination, b.routing_key)):
            if not vhost.entities.persisted(binding.destination):
                continue
            bindings.append(
                {
                    "source": exchange.name,
                    **tag,
                    "destination": binding.destination.name,
                    "destination_type": binding.destination.kind,
                    "routing_key": binding.routing_key,
                    "arguments": _arguments(dict(binding.arguments)),
                }
            )
    policies = [p.to_json(vhost.name) for _, p in sorted(vhost.policies.items())]
    if not with_vhost:
        for shown in policies:
            del shown["vhost"]
    parameters = vhost_parameters(vhost, None, admin=True, limits=limits)
    return {
        "parameters": parameters,
        "policies": policies,
        "queues": [
            {
                "name": q.name,
                **tag,
                "durable": q.durable,
                "auto_delete": q.auto_delete,
                "arguments": _arguments(q.arguments),
            }
            for q in queues
        ],
        "exchanges": [
            {
                "name": e.name,
                **tag,
                "type": e.type,
                "durable": e.durable,
                "auto_delete": e.auto_delete,
                "internal": e.internal,
                "arguments": _arguments(e.arguments),
            }
            for e in exchanges
        ],
        "bindings": bindings,
    }


def vhost_entry(name: str, metadata: VHostMetadata) -> Entry:
    """A vhost as RabbitMQ exports it: `name` only without metadata (3.10's management
    export keeps nothing else), else also its description, tags and default queue type,
    top-level and under `metadata`, as RabbitMQ 3.11 exports them and 3.10 imports them."""
    if metadata == NO_METADATA:
        return {"name": name}
    kept: Entry = {"description": metadata.description, "tags": list(metadata.tags)}
    if metadata.default_queue_type is not None:
        kept["default_queue_type"] = metadata.default_queue_type
    return {"name": name, **kept, "metadata": kept}


def export_broker(broker: Broker) -> dict[str, object]:
    """The whole broker's definitions document."""
    accounts = broker.accounts
    document: dict[str, object] = {
        "rabbit_version": __version__,
        "rabbitmq_version": __version__,
        "product_name": "streamq",
        "product_version": __version__,
        "users": [
            {
                "name": u.name,
                "password_hash": u.password_hash,
                "hashing_algorithm": HASHING_ALGORITHM,
                "tags": list(u.tags),
                "limits": dict(accounts.user_limits(u.name)),
            }
            for u in accounts.list_users()
        ],
        "vhosts": [
            vhost_entry(name, accounts.vhost_metadata(name)) for name in accounts.list_vhosts()
        ],
        "permissions": [
            {
                "user": p.user,
                "vhost": p.vhost,
                "configure": p.configure,
                "write": p.write,
                "read": p.read,
            }
            for p in accounts.list_permissions()
        ],
        "topic_permissions": [topic_permission_json(t) for t in accounts.list_topic_permissions()],
        "global_parameters": [],
    }
    parts: dict[str, list[Entry]] = {
        "parameters": [],
        "policies": [],
        "queues": [],
        "exchanges": [],
        "bindings": [],
    }
    for _, vhost in sorted(broker.vhosts.items()):
        for key, entries in vhost_entities(vhost, True, accounts.vhost_limits(vhost.name)).items():
            parts[key] += entries
    return {**document, **parts}


@routes.get("/api/definitions")
async def export_all(request: web.Request) -> web.Response:
    return web.json_response(export_broker(administrator(request).broker))


def _vhost(who: Caller, name: str) -> VHost:
    vhost = who.broker.vhosts.get(name)
    if vhost is None:
        if name in who.broker.failed_vhosts:
            raise HttpError(503, f"vhost {name} is unavailable: {who.broker.failed_vhosts[name]}")
        raise HttpError(404, "Not Found")
    return vhost


@routes.get("/api/definitions/{vhost}")
async def export_vhost(request: web.Request) -> web.Response:
    who = administrator(request)
    vhost = _vhost(who, request.match_info["vhost"])
    limits = who.broker.accounts.vhost_limits(vhost.name)
    return web.json_response(
        {"rabbit_version": __version__, **vhost_entities(vhost, False, limits)}
    )


# -- import (the work is streamq.broker.definitions_import) ---------------------------


@routes.post("/api/definitions")
async def import_all(request: web.Request) -> web.Response:
    who = administrator(request)
    await Importer(who.broker, await read_json_object(request), None, user=who.user.name).run()
    return web.Response(status=204)


@routes.post("/api/definitions/{vhost}")
async def import_vhost(request: web.Request) -> web.Response:
    who = administrator(request)
    vhost = _vhost(who, request.match_info["vhost"])
    await Importer(
        who.broker, await read_json_object(request), vhost.name, user=who.user.name
    ).run()
    return web.Response(status=204)
