"""`/api/definitions[/{vhost}]`: export and import in RabbitMQ's definitions JSON format.

Owns the translation between the broker's state and RabbitMQ's definitions document
(`rabbit_version`, users with `password_hash` + `hashing_algorithm`, vhosts, permissions,
policies, operator policies as `parameters` of component `operator_policy`, queues,
exchanges, bindings). Export lists what survives a restart: durable exchanges (not the
predeclared ones), durable non-exclusive queues and the bindings between them. Import is
idempotent (declarations of what exists with the same attributes change nothing) and
durable before the reply: accounts fsync in a worker thread, each vhost touched waits for
a sync round. Parts streamq does not have (topic permissions, vhost limits, global
parameters) are accepted and ignored with a log line. All routes need `administrator`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Final

from aiohttp import web

from http_gateway.context import Caller, caller, read_json_object, require_tags
from http_gateway.errors import HttpError
from http_gateway.fields import flag
from http_gateway.parameters_api import OPERATOR_POLICY_COMPONENT, parameter_json
from streamq import __version__
from streamq.broker.accounts import PERMISSION_KINDS, Permission, check_tags
from streamq.broker.broker import Broker
from streamq.broker.exchange import Destination
from streamq.broker.users import HASHING_ALGORITHM, User
from streamq.broker.vhost import VHost
from streamq.broker.vhost_store import PREDECLARED_NAMES

logger = logging.getLogger(__name__)

ADMIN_TAGS: Final = frozenset({"administrator"})
POLICY_KEYS: Final[tuple[str, ...]] = ("pattern", "apply-to", "definition", "priority")
ENTRIES_MAX: Final = 1_000_000  # per list of a document (the body is capped too)

routes = web.RouteTableDef()

Entry = dict[str, object]


def _admin(request: web.Request) -> Caller:
    who = caller(request)
    require_tags(who, ADMIN_TAGS)
    return who


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


def vhost_entities(vhost: VHost, with_vhost: bool) -> dict[str, list[Entry]]:
    """The policies, operator policies, queues, exchanges and bindings that survive a
    restart, as RabbitMQ exports them (`vhost` keys only in a whole-broker export)."""
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
            if not vhost._persisted(binding.destination):
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
    parameters = [parameter_json(vhost.name, p) for _, p in sorted(vhost.operator_policies.items())]
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
                "limits": {},
            }
            for u in accounts.list_users()
        ],
        "vhosts": [{"name": name} for name in accounts.list_vhosts()],
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
        "topic_permissions": [],
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
        for key, entries in vhost_entities(vhost, True).items():
            parts[key] += entries
    return {**document, **parts}


@routes.get("/api/definitions")
async def export_all(request: web.Request) -> web.Response:
    return web.json_response(export_broker(_admin(request).broker))


def _vhost(who: Caller, name: str) -> VHost:
    vhost = who.broker.vhosts.get(name)
    if vhost is None:
        if name in who.broker.failed_vhosts:
            raise HttpError(503, f"vhost {name} is unavailable: {who.broker.failed_vhosts[name]}")
        raise HttpError(404, "Not Found")
    return vhost


@routes.get("/api/definitions/{vhost}")
async def export_vhost(request: web.Request) -> web.Response:
    vhost = _vhost(_admin(request), request.match_info["vhost"])
    return web.json_response({"rabbit_version": __version__, **vhost_entities(vhost, False)})


# -- import --------------------------------------------------------------------------------


def _entries(document: Mapping[str, object], key: str) -> list[Entry]:
    value = document.get(key, [])
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise HttpError(400, f"'{key}' must be a list of objects")
    if len(value) > ENTRIES_MAX:
        raise HttpError(400, f"'{key}' has more than {ENTRIES_MAX} entries")
    return value


def _text(entry: Entry, key: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise HttpError(400, f"'{key}' must be a string in {str(entry)[:120]}")
    return value


def _flag(entry: Entry, key: str, default: bool) -> bool:
    return flag(entry, key, default, where=f" in {str(entry)[:120]}")


def _mapping(entry: Entry, key: str) -> dict[str, object]:
    value = entry.get(key) or {}
    if not isinstance(value, dict):
        raise HttpError(400, f"'{key}' must be an object in {str(entry)[:120]}")
    return value


def parse_user(entry: Entry) -> User:
    algorithm = _text(entry, "hashing_algorithm", HASHING_ALGORITHM)
    if algorithm != HASHING_ALGORITHM:
        raise HttpError(
            400, f"user {entry.get('name')!r}: hashing_algorithm {algorithm} is not supported"
        )
    tags = entry.get("tags", [])
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise HttpError(400, f"user {entry.get('name')!r}: tags must be a string or a list")
    return User(_text(entry, "name"), _text(entry, "password_hash", ""), check_tags(tags))


def parse_permission(entry: Entry) -> Permission:
    regexes = [_text(entry, kind) for kind in PERMISSION_KINDS]
    return Permission(_text(entry, "user"), _text(entry, "vhost"), *regexes)


class Importer:
    """One import: the document's entities applied to the broker, vhost by vhost."""

    def __init__(self, broker: Broker, document: Mapping[str, object], vhost: str | None):
        self.broker = broker
        self.document = document
        self.only_vhost = vhost  # a vhost-level import: entries carry no vhost
        self.touched: dict[str, VHost] = {}

    def vhost_of(self, entry: Entry) -> VHost:
        name = self.only_vhost if self.only_vhost is not None else entry.get("vhost")
        vhost = self.broker.vhosts.get(name) if isinstance(name, str) else None
        if vhost is None:
            raise HttpError(400, f"no_such_vhost: {name!r}")
        self.touched[vhost.name] = vhost
        return vhost

    async def accounts(self) -> None:
        """Vhosts first (created and opened), then users and permissions in one change."""
        doc = self.document
        names = [_text(e, "name") for e in _entries(doc, "vhosts")]
        users = [parse_user(e) for e in _entries(doc, "users")]
        permissions = [parse_permission(e) for e in _entries(doc, "permissions")]
        for name in names:
            if not self.broker.accounts.has_vhost(name):
                await self.broker.create_vhost(name)
        if users or permissions:
            await asyncio.to_thread(self.broker.accounts.merge, users, permissions)
        for key in ("topic_permissions", "global_parameters"):
            if _entries(doc, key):
                logger.info("definitions import: %s are not supported; ignored", key)

    def policies(self) -> None:
        for entry in _entries(self.document, "policies"):
            self._policy(entry, entry, operator=False)
        for entry in _entries(self.document, "parameters"):
            if entry.get("component") != OPERATOR_POLICY_COMPONENT:
                logger.info(
                    "definitions import: parameter %r of component %r is not supported; ignored",
                    entry.get("name"),
                    entry.get("component"),
                )
                continue
            self._policy(entry, _mapping(entry, "value"), operator=True)

    def _policy(self, entry: Entry, body: Entry, *, operator: bool) -> None:
        vhost = self.vhost_of(entry)
        name = _text(entry, "name")
        table = vhost.operator_policies if operator else vhost.policies
        existing = table.get(name)
        wanted = {k: body[k] for k in POLICY_KEYS if k in body}
        if existing is not None and _same_policy(existing.to_json(vhost.name), wanted):
            return
        vhost.set_policy(name, wanted, operator=operator)

    def entities(self) -> None:
        for entry in _entries(self.document, "queues"):
            self.vhost_of(entry).declare_queue(
                _text(entry, "name"),
                False,
                _flag(entry, "durable", True),
                False,
                _flag(entry, "auto_delete", False),
                _mapping(entry, "arguments"),
                None,
            )
        for entry in _entries(self.document, "exchanges"):
            self.vhost_of(entry).declare_exchange(
                _text(entry, "name"),
                _text(entry, "type"),
                False,
                _flag(entry, "durable", True),
                _flag(entry, "auto_delete", False),
                _flag(entry, "internal", False),
                _mapping(entry, "arguments"),
            )
        for entry in _entries(self.document, "bindings"):
            kind = _text(entry, "destination_type")
            if kind not in ("queue", "exchange"):
                raise HttpError(400, f"destination_type must be queue or exchange, not {kind!r}")
            source = _text(entry, "source")
            if source == "":
                continue  # the default exchange's implicit bindings
            self.vhost_of(entry).bind(
                Destination(kind, _text(entry, "destination")),
                source,
                _text(entry, "routing_key", ""),
                _mapping(entry, "arguments"),
            )

    async def run(self) -> None:
        try:
            if self.only_vhost is None:
                await self.accounts()
            self.policies()
            self.entities()
        finally:  # what was applied is made durable even if a later entry failed
            for vhost in self.touched.values():
                await vhost.sync_all()


def _same_policy(current: Mapping[str, object], wanted: Mapping[str, object]) -> bool:
    defaults: dict[str, object] = {"apply-to": "all", "priority": 0}
    return all(current.get(k) == wanted.get(k, defaults.get(k)) for k in POLICY_KEYS)


@routes.post("/api/definitions")
async def import_all(request: web.Request) -> web.Response:
    broker = _admin(request).broker
    await Importer(broker, await read_json_object(request), None).run()
    return web.Response(status=204)


@routes.post("/api/definitions/{vhost}")
async def import_vhost(request: web.Request) -> web.Response:
    who = _admin(request)
    vhost = _vhost(who, request.match_info["vhost"])
    await Importer(who.broker, await read_json_object(request), vhost.name).run()
    return web.Response(status=204)
