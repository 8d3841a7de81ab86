"""Importing a RabbitMQ definitions document (users, vhosts, permissions, policies, operator
policies, queues, exchanges, bindings, and the runtime parameters of shovels and federation
upstreams) into the broker.

Owns the one import, which the management API (`POST /api/definitions[/{vhost}]`) and the
boot-time `load_definitions` setting both run. Import is idempotent (declarations of what
exists with the same attributes change nothing) and durable on return: accounts fsync in a
worker thread, each vhost touched waits for a sync round. A vhost's description, tags
and default queue type are kept (top-level or under `metadata`, as RabbitMQ 3.10 reads
them); a vhost with `tracing: true` is refused (streamq has no tracer), and so are
`limits` inside a vhost entry, which RabbitMQ 3.10 ignores: its exports carry vhost limits
as parameters of component `vhost-limits`, which are imported (as RabbitMQ, after the
check that the document's new queues fit the limits in force: "Adding N queue(s) ...
Import aborted!"), and so are users' `limits`. Parameters of other plugins are refused
(RabbitMQ refuses those too), before anything is applied. Global parameters (`cluster_name`,
`internal_cluster_id`), which change no behaviour, are accepted and ignored with a log line.
A malformed document raises DefinitionsInvalid; the vhost's own checks raise their
domain errors (PreconditionFailed...). It knows neither HTTP nor status codes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import BinaryIO, Final

from streamq.broker import json_text
from streamq.broker.account_limits import (
    MAX_QUEUES,
    VHOST_COMPONENT,
    VHOST_PARAMETER,
    LimitInvalid,
    Limits,
    check_user_limits,
    check_vhost_limits,
    queues_would_exceed,
)
from streamq.broker.account_values import AccountValueInvalid, check_vhost_metadata
from streamq.broker.accounts import PERMISSION_KINDS, Permission, VHostMetadata, check_tags
from streamq.broker.broker import Broker
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Destination
from streamq.broker.link_definitions import COMPONENTS, ParameterInvalid
from streamq.broker.topic_permissions import TOPIC_KINDS, TopicPermission
from streamq.broker.users import HASHING_ALGORITHM, User
from streamq.broker.vhost import VHost
from streamq.progress import Progress

logger = logging.getLogger(__name__)

POLICY_KEYS: Final[tuple[str, ...]] = ("pattern", "apply-to", "definition", "priority")
ENTRIES_MAX: Final = 1_000_000  # per list of a document (the body or file is capped too)
FILE_BYTES_MAX: Final = 16 * 1024 * 1024  # as the management API's body limit
READ_CHUNK_BYTES: Final = 64 * 1024
OPERATOR_POLICY_COMPONENT: Final = "operator_policy"  # RabbitMQ's runtime parameter component
VHOST_LIMITS_COMPONENT: Final = VHOST_COMPONENT  # RabbitMQ exports vhost limits so
# Who sets the parameters of an import at boot (RabbitMQ's ?INTERNAL_USER).
INTERNAL_USER: Final = "rmq-internal"
# How RabbitMQ's management plugin reads a boolean field (rabbit_mgmt_util:parse_bool/1).
BOOLEAN_TEXTS: Final = {"true": True, "false": False}
# The lists a progress line counts: each entry is an item (accounts only in a full import).
ACCOUNT_KEYS: Final = ("vhosts", "users", "permissions", "topic_permissions")
ITEM_KEYS: Final = ("policies", "queues", "exchanges", "bindings", "parameters")

Entry = dict[str, object]


class DefinitionsInvalid(BrokerError):
    """A definitions document (or file) that cannot be imported; the message says why."""


def _read_bounded(file: BinaryIO) -> bytes:
    """The file's bytes, or its first FILE_BYTES_MAX + 1 when it is bigger: read in
    READ_CHUNK_BYTES pieces, so that a small file does not cost a buffer of the limit
    (under ASan, the fuzz soak's, that allocation was most of each input's time)."""
    data = bytearray()
    while len(data) <= FILE_BYTES_MAX and (chunk := file.read(READ_CHUNK_BYTES)):
        data += chunk
    return bytes(data[: FILE_BYTES_MAX + 1])


def read_definitions_file(path: str) -> dict[str, object]:
    """The definitions document in the JSON file at `path`.

    Raises DefinitionsInvalid if it cannot be read, is too big, is not JSON or not a JSON
    object (the caller names the file).
    """
    try:
        with open(path, "rb") as file:
            data = _read_bounded(file)
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


def parse_user_limits(entry: Entry) -> tuple[str, Limits] | None:
    """A user entry's `limits` (RabbitMQ 3.10 exports `{}` for none): None without."""
    if not entry.get("limits"):
        return None
    try:
        return _text(entry, "name"), check_user_limits(entry["limits"])
    except LimitInvalid as exc:
        raise DefinitionsInvalid(f"user {entry.get('name')!r}: {exc}") from None


def parse_vhost_limits(entry: Entry) -> Limits:
    """The value of a `vhost-limits` parameter (name `limits`, the only one RabbitMQ has)."""
    if entry.get("name") != VHOST_PARAMETER:
        raise DefinitionsInvalid(
            f"{VHOST_LIMITS_COMPONENT} has one parameter, '{VHOST_PARAMETER}', "
            f"not {entry.get('name')!r}"
        )
    try:
        return check_vhost_limits(entry.get("value"))
    except LimitInvalid as exc:
        raise DefinitionsInvalid(f"vhost limits of {entry.get('vhost')!r}: {exc}") from None


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


def parse_topic_permission(entry: Entry) -> TopicPermission:
    regexes = [_text(entry, kind) for kind in TOPIC_KINDS]
    user, vhost, exchange = (_text(entry, key) for key in ("user", "vhost", "exchange"))
    return TopicPermission(user, vhost, exchange, *regexes)


def parse_vhost(entry: Entry) -> tuple[str, VHostMetadata]:
    """A vhost entry's name and metadata, read as RabbitMQ's `rabbit_definitions:add_vhost`
    (description and tags top-level first, then under `metadata`; the default queue type
    under `metadata`, or top-level as RabbitMQ 3.11 exports it). Refuses `tracing: true`
    and limits in the entry (RabbitMQ ignores those; see the module docstring)."""
    name = _text(entry, "name")
    if _flag(entry, "tracing", False):
        raise DefinitionsInvalid(f"vhost {name!r}: tracing is not supported by streamq")
    if entry.get("limits"):
        raise DefinitionsInvalid(
            f"vhost {name!r}: limits inside a vhost entry are ignored by RabbitMQ 3.10; give "
            f"them as a parameter of component {VHOST_LIMITS_COMPONENT}, as its exports do"
        )
    metadata = _mapping(entry, "metadata")
    description = entry.get("description", metadata.get("description", ""))
    tags = entry.get("tags", metadata.get("tags", []))
    queue_type = metadata.get("default_queue_type", entry.get("default_queue_type"))
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise DefinitionsInvalid(f"vhost {name!r}: tags must be a string or a list")
    if not isinstance(description, str) or not isinstance(queue_type, str | None):
        raise DefinitionsInvalid(f"vhost {name!r}: description and queue type are strings")
    try:
        return name, check_vhost_metadata(VHostMetadata(description, tuple(tags), queue_type))
    except AccountValueInvalid as exc:
        raise DefinitionsInvalid(f"vhost {name!r}: {exc}") from None


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
        self.progress = Progress(logger, "definitions import", 0, "items")  # total in run

    def vhost_of(self, entry: Entry) -> VHost:
        name = self.only_vhost if self.only_vhost is not None else entry.get("vhost")
        vhost = self.broker.vhosts.get(name) if isinstance(name, str) else None
        if vhost is None:
            raise DefinitionsInvalid(f"no_such_vhost: {name!r}")
        self.touched[vhost.name] = vhost
        return vhost

    async def accounts(self) -> None:
        """Vhosts first (created and opened), then users and permissions in one change,
        then topic permissions in another."""
        doc = self.document
        vhosts = [parse_vhost(e) for e in _entries(doc, "vhosts")]
        users = [parse_user(e) for e in _entries(doc, "users")]
        user_limits = [found for e in _entries(doc, "users") if (found := parse_user_limits(e))]
        permissions = [parse_permission(e) for e in _entries(doc, "permissions")]
        topics = [parse_topic_permission(e) for e in _entries(doc, "topic_permissions")]
        accounts = self.broker.accounts
        for name, metadata in vhosts:
            if not accounts.has_vhost(name):
                await self.broker.create_vhost(name, metadata)
                await self._grant_creator(name)
                continue
            # As rabbit_vhost:update/4: description and tags; the queue type stays.
            kept = accounts.vhost_metadata(name).default_queue_type
            changed = VHostMetadata(metadata.description, metadata.tags, kept)
            await self.broker.change_durably(accounts.set_vhost_metadata, name, changed)
        if users or permissions:
            await self.broker.change_durably(self.broker.accounts.merge, users, permissions)
        if topics:
            await self.broker.change_durably(accounts.merge_topic_permissions, topics)
        if user_limits:
            await self.broker.change_durably(accounts.merge_limits, [], user_limits)
        self.progress.step(len(vhosts) + len(users) + len(permissions) + len(topics))
        if _entries(doc, "global_parameters"):
            logger.info("definitions import: global_parameters are not supported; ignored")

    async def _grant_creator(self, vhost: str) -> None:
        """As RabbitMQ's `maybe_grant_full_permissions`: the user importing a new vhost may
        use it at once (not the boot-time import, by the internal user). The document's
        own permissions, applied next, may change that."""
        accounts = self.broker.accounts
        if self.user != INTERNAL_USER and accounts.user(self.user) is not None:
            full = (".*", ".*", ".*")
            await self.broker.change_durably(accounts.set_permissions, self.user, vhost, *full)

    def policies(self) -> None:
        for entry in _entries(self.document, "policies"):
            self._policy(entry, entry, operator=False)
            self.progress.step()
        for entry in _entries(self.document, "parameters"):
            component = entry.get("component")
            if component == OPERATOR_POLICY_COMPONENT:
                self._policy(entry, _mapping(entry, "value"), operator=True)

    def check_queue_limits(self) -> None:
        """RabbitMQ's `validate_limits`: the queues of the document that do not exist yet
        must fit each vhost's max-queues in force before the import (not the limits it
        sets); raises DefinitionsInvalid with RabbitMQ's text before any is declared."""
        added: dict[str, set[str]] = {}
        for entry in _entries(self.document, "queues"):
            name = self.only_vhost if self.only_vhost is not None else entry.get("vhost")
            vhost = self.broker.vhosts.get(name) if isinstance(name, str) else None
            queue = entry.get("name")
            if vhost is not None and isinstance(queue, str) and queue not in vhost.queues:
                added.setdefault(vhost.name, set()).add(queue)
        for name, queues in sorted(added.items()):
            limit = self.broker.accounts.vhost_limit(name, MAX_QUEUES)
            count = len(self.broker.vhosts[name].queues)
            if limit is not None and count + len(queues) > limit:
                raise DefinitionsInvalid(queues_would_exceed(name, len(queues), limit, count))

    async def vhost_limits(self) -> None:
        """The `vhost-limits` parameters, each replacing its vhost's limits."""
        found = [
            (self.vhost_of(entry).name, parse_vhost_limits(entry))
            for entry in _entries(self.document, "parameters")
            if entry.get("component") == VHOST_LIMITS_COMPONENT
        ]
        if found:
            await self.broker.change_durably(self.broker.accounts.merge_limits, found, [])

    def parameters(self) -> None:
        """Shovels and federation upstreams, after the queues and exchanges they use.
        One already set to the same value is left as it is (its link keeps running)."""
        for entry in _entries(self.document, "parameters"):
            self.progress.step()
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
            self.progress.step()
        for entry in _entries(self.document, "exchanges"):
            self.vhost_of(entry).declare_exchange(
                _text(entry, "name"),
                _text(entry, "type"),
                False,
                _flag(entry, "durable", True),
                _flag(entry, "auto_delete", False),
                _flag(entry, "internal", False),
                _mapping(entry, "arguments"),
                self.user,
            )
            self.progress.step()
        for entry in _entries(self.document, "bindings"):
            self.progress.step()
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
        check_components(self.document)  # before anything is applied
        keys = ITEM_KEYS if self.only_vhost is not None else ACCOUNT_KEYS + ITEM_KEYS
        self.progress.total = sum(len(_entries(self.document, key)) for key in keys)
        try:
            if self.only_vhost is None:
                await self.accounts()
            self.check_queue_limits()
            self.policies()
            await self.vhost_limits()
            self.entities()
            self.parameters()
            self.progress.finish()
        finally:  # what was applied is made durable even if a later entry failed
            for vhost in self.touched.values():
                await vhost.sync_all()


def check_components(document: Mapping[str, object]) -> None:
    """Raises DefinitionsInvalid for a runtime parameter streamq cannot honour: a
    component of a plugin streamq does not have (RabbitMQ's import fails on those too:
    "component ... not found"), or vhost limits that are not valid."""
    for entry in _entries(document, "parameters"):
        component = entry.get("component")
        if component == VHOST_LIMITS_COMPONENT:
            parse_vhost_limits(entry)
            continue
        if component != OPERATOR_POLICY_COMPONENT and component not in COMPONENTS:
            raise DefinitionsInvalid(f"component {component!r} not found")


def _same_policy(current: Mapping[str, object], wanted: Mapping[str, object]) -> bool:
    defaults: dict[str, object] = {"apply-to": "all", "priority": 0}
    return all(current.get(k) == wanted.get(k, defaults.get(k)) for k in POLICY_KEYS)
