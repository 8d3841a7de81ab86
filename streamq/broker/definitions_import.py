"""Importing a RabbitMQ definitions document (users, vhosts, permissions, policies, operator
policies, queues, exchanges, bindings, and the runtime parameters of shovels and federation
upstreams) into the broker.

Owns the one import, which the management API (`POST /api/definitions[/{vhost}]`) and the
boot-time `load_definitions` setting both run. Import is idempotent (declarations of what
exists with the same attributes change nothing) and durable on return: accounts fsync in a
worker thread, each vhost touched waits for a sync round. Parts streamq does not have
(topic permissions, vhost limits, global parameters, parameters of other plugins) are
accepted and ignored with a log line. A malformed document raises DefinitionsInvalid;
the vhost's own checks raise their domain errors (PreconditionFailed...). It knows
neither HTTP nor status codes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

from streamq.broker import json_text
from streamq.broker.accounts import PERMISSION_KINDS, Permission, check_tags
from streamq.broker.broker import Broker
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Destination
from streamq.broker.link_definitions import COMPONENTS, ParameterInvalid
from streamq.broker.users import HASHING_ALGORITHM, User
from streamq.broker.vhost import VHost

logger = logging.getLogger(__name__)

POLICY_KEYS: Final[tuple[str, ...]] = ("pattern", "apply-to", "definition", "priority")
ENTRIES_MAX: Final = 1_000_000  # per list of a document (the body or file is capped too)
FILE_BYTES_MAX: Final = 16 * 1024 * 1024  # as the management API's body limit
OPERATOR_POLICY_COMPONENT: Final = "operator_policy"  # RabbitMQ's runtime parameter component
# Who sets the parameters of an import at boot (RabbitMQ's ?INTERNAL_USER).
INTERNAL_USER: Final = "rmq-internal"
# How RabbitMQ's management plugin reads a boolean field (rabbit_mgmt_util:parse_bool/1).
BOOLEAN_TEXTS: Final = {"true": True, "false": False}

Entry = dict[str, object]


class DefinitionsInvalid(BrokerError):
    """A definitions document (or file) that cannot be imported; the message says why."""


def read_definitions_file(path: str) -> dict[str, object]:
    """The definitions document in the JSON file at `path`.

    Raises DefinitionsInvalid if it cannot be read, is too big, is not JSON or not a JSON
    object (the caller names the file).
    """
    try:
        with open(path, "rb") as file:
            data = file.read(FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise DefinitionsInvalid(f"cannot read: {exc.strerror}") from None
    if len(data) > FILE_BYTES_MAX:
        raise DefinitionsInvalid(f"larger than {FILE_BYTES_MAX} bytes")
    try:
        document = json_text.loads(data)
    except ValueError as exc:
        raise DefinitionsInvalid(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise DefinitionsInvalid("not a definitions document (a JSON object)")
    return document


def _entries(document: Mapping[str, object], key: str) -> list[Entry]:
    value = document.get(key, [])
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise DefinitionsInvalid(f"'{key}' must be a list of objects")
    if len(value) > ENTRIES_MAX:
        raise DefinitionsInvalid(f"'{key}' has more than {ENTRIES_MAX} entries")
    return value


def _text(entry: Entry, key: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise DefinitionsInvalid(f"'{key}' must be a string in {str(entry)[:120]}")
    return value


def _flag(entry: Entry, key: str, default: bool) -> bool:
    # JSON true/false or the strings "true"/"false"; an explicit null is refused, as
    # RabbitMQ refuses it.
    if key not in entry:
        return default
    value = entry[key]
    found = BOOLEAN_TEXTS.get(value) if isinstance(value, str) else value
    if not isinstance(found, bool):
        raise DefinitionsInvalid(f"{key} must be true or false in {str(entry)[:120]}")
    return found


def _mapping(entry: Entry, key: str) -> dict[str, object]:
    value = entry.get(key) or {}
    if not isinstance(value, dict):
        raise DefinitionsInvalid(f"'{key}' must be an object in {str(entry)[:120]}")
    return value


def parse_user(entry: Entry) -> User:
    algorithm = _text(entry, "hashing_algorithm", HASHING_ALGORITHM)
    if algorithm != HASHING_ALGORITHM:
        raise DefinitionsInvalid(
            f"user {entry.get('name')!r}: hashing_algorithm {algorithm} is not supported"
        )
    tags = entry.get("tags", [])
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise DefinitionsInvalid(f"user {entry.get('name')!r}: tags must be a string or a list")
    return User(_text(entry, "name"), _text(entry, "password_hash", ""), check_tags(tags))


def parse_permission(entry: Entry) -> Permission:
    regexes = [_text(entry, kind) for kind in PERMISSION_KINDS]
    return Permission(_text(entry, "user"), _text(entry, "vhost"), *regexes)


class Importer:
    """One import: the document's entities applied to the broker, vhost by vhost."""

    def __init__(
        self,
        broker: Broker,
        document: Mapping[str, object],
        vhost: str | None,
        *,
        user: str = INTERNAL_USER,
    ):
        self.broker = broker
        self.document = document
        self.only_vhost = vhost  # a vhost-level import: entries carry no vhost
        self.user = user  # who sets the runtime parameters (a local shovel connects so)
        self.touched: dict[str, VHost] = {}

    def vhost_of(self, entry: Entry) -> VHost:
        name = self.only_vhost if self.only_vhost is not None else entry.get("vhost")
        vhost = self.broker.vhosts.get(name) if isinstance(name, str) else None
        if vhost is None:
            raise DefinitionsInvalid(f"no_such_vhost: {name!r}")
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
            await self.broker.change_durably(self.broker.accounts.merge, users, permissions)
        for key in ("topic_permissions", "global_parameters"):
            if _entries(doc, key):
                logger.info("definitions import: %s are not supported; ignored", key)

    def policies(self) -> None:
        for entry in _entries(self.document, "policies"):
            self._policy(entry, entry, operator=False)
        for entry in _entries(self.document, "parameters"):
            component = entry.get("component")
            if component == OPERATOR_POLICY_COMPONENT:
                self._policy(entry, _mapping(entry, "value"), operator=True)
            elif component not in COMPONENTS:
                logger.info(
                    "definitions import: parameter %r of component %r is not supported; ignored",
                    entry.get("name"),
                    component,
                )

    def parameters(self) -> None:
        """Shovels and federation upstreams, after the queues and exchanges they use.
        One already set to the same value is left as it is (its link keeps running)."""
        for entry in _entries(self.document, "parameters"):
            component = entry.get("component")
            if component not in COMPONENTS:
                continue
            vhost = self.vhost_of(entry)
            name = _text(entry, "name")
            value = entry.get("value")
            if vhost.parameters.get(str(component), name) == value:
                continue
            try:
                vhost.parameters.put(str(component), name, value, self.user)
            except ParameterInvalid as exc:
                raise DefinitionsInvalid(f"parameter {component}/{name}: {exc}") from None

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
                raise DefinitionsInvalid(
                    f"destination_type must be queue or exchange, not {kind!r}"
                )
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
        """Apply the document. Raises DefinitionsInvalid and the vhosts' domain errors;
        what was applied before an error is durable on return all the same."""
        try:
            if self.only_vhost is None:
                await self.accounts()
            self.policies()
            self.entities()
            self.parameters()
        finally:  # what was applied is made durable even if a later entry failed
            for vhost in self.touched.values():
                await vhost.sync_all()


def _same_policy(current: Mapping[str, object], wanted: Mapping[str, object]) -> bool:
    defaults: dict[str, object] = {"apply-to": "all", "priority": 0}
    return all(current.get(k) == wanted.get(k, defaults.get(k)) for k in POLICY_KEYS)
