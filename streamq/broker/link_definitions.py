"""Definitions of shovels and federation upstreams: RabbitMQ's runtime parameter values,
validated, with their defaults.

Owns the reading of the `value` of a parameter of component "shovel" (RabbitMQ's shovel
plugin keys, amqp091 on both ends, and LavinMQ's http(s) destination), "federation-upstream"
and "federation-upstream-set" (RabbitMQ's federation plugin keys) into frozen dataclasses
the links runtime (`streamq.links`) runs from. Unknown keys, wrong types and conflicting
keys raise ParameterInvalid with a reason in RabbitMQ's words; nothing else is checked
here (a URI is checked for syntax only: whether its broker answers is the runtime's
business). It knows no storage, no sockets and no HTTP.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from streamq.broker.errors import BrokerError

SHOVEL: Final = "shovel"
UPSTREAM: Final = "federation-upstream"
UPSTREAM_SET: Final = "federation-upstream-set"
COMPONENTS: Final = (SHOVEL, UPSTREAM, UPSTREAM_SET)
ACK_MODES: Final = ("on-confirm", "on-publish", "no-ack")
DELETE_AFTER: Final = ("never", "queue-length")
AMQP_SCHEMES: Final = ("amqp", "amqps")
HTTP_SCHEMES: Final = ("http", "https")  # LavinMQ's HTTP shovel destination
# RabbitMQ's URI query parameters (amqp_uri); others are refused so that a typo shows.
URI_QUERY_KEYS: Final = frozenset(
    {
        "heartbeat",
        "connection_timeout",
        "channel_max",
        "frame_max",
        "auth_mechanism",
        "cacertfile",
        "certfile",
        "keyfile",
        "verify",
        "server_name_indication",
        "fail_if_no_peer_cert",
        "depth",
        "password",
    }
)
URIS_MAX: Final = 64  # URIs of one end: RabbitMQ picks one at random per connection
PREFETCH_MAX: Final = 65_535  # basic.qos prefetch_count is a short
UPSTREAM_SET_MEMBERS_MAX: Final = 1_000
REDACTED: Final = "********"  # a password's stand-in in status and errors


class ParameterInvalid(BrokerError):
    """A parameter value that cannot be stored; the message says which key and why."""


@dataclass(frozen=True, slots=True)
class ShovelDefinition:
    """A dynamic shovel: from a queue (or an exchange, through a queue of its own) of the
    source broker to a queue or exchange of the destination broker (or an HTTP endpoint).
    A destination with neither queue nor exchange keeps each message's own exchange and
    routing key, as RabbitMQ's."""

    src_uris: tuple[str, ...]
    dest_uris: tuple[str, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = "#"  # RabbitMQ's default binding key for src-exchange
    src_prefetch_count: int = 1000
    src_delete_after: str | int = "never"
    src_consumer_args: Mapping[str, object] = field(default_factory=dict)
    src_queue_args: Mapping[str, object] = field(default_factory=dict)
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    dest_queue_args: Mapping[str, object] = field(default_factory=dict)
    dest_publish_properties: Mapping[str, object] = field(default_factory=dict)
    dest_add_forward_headers: bool = False
    dest_add_timestamp_header: bool = False
    ack_mode: str = "on-confirm"
    reconnect_delay_s: float = 1.0
    src_protocol: str = "amqp091"
    dest_protocol: str = "amqp091"

    @property
    def dest_is_http(self) -> bool:
        return urlsplit(self.dest_uris[0]).scheme.lower() in HTTP_SCHEMES


@dataclass(frozen=True, slots=True)
class UpstreamDefinition:
    """A federation upstream: the broker(s) a federated exchange or queue takes from.
    `exchange`/`queue` None: the same name as the downstream one."""

    uris: tuple[str, ...]
    exchange: str | None = None
    queue: str | None = None
    consumer_tag: str | None = None
    prefetch_count: int = 1000
    reconnect_delay_s: float = 5.0
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    max_hops: int = 1
    expires_ms: int | None = None
    message_ttl_ms: int | None = None
    queue_type: str = "classic"
    bind_nowait: bool = False
    resource_cleanup_mode: str = "default"
    channel_use_mode: str = "multiple"


@dataclass(frozen=True, slots=True)
class UpstreamSetMember:
    """One entry of an upstream set: an upstream by name, with keys that override it."""

    upstream: str
    overrides: Mapping[str, object] = field(default_factory=dict)

    def apply(self, upstream: UpstreamDefinition) -> UpstreamDefinition:
        """The upstream with this member's overrides (already validated)."""
        # Each field's value was checked against its key (`_upstream_value`).
        return dataclasses.replace(upstream, **_shared_fields(self.overrides))  # type: ignore[arg-type]


# -- checks of one value, in RabbitMQ's words ("x should be a number, actually was y") ----


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return text if len(text) <= 80 else text[:77] + "..."


def _text(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ParameterInvalid(f"{key} should be a string, actually was {_shown(value)}")
    return value


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ParameterInvalid(f"{key} should be a boolean, actually was {_shown(value)}")
    return value


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ParameterInvalid(
            f"{key} should be a non-negative number, actually was {_shown(value)}"
        )
    return float(value)


def _integer(key: str, value: object, maximum: int | None = None) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ParameterInvalid(
            f"{key} should be a non-negative integer, actually was {_shown(value)}"
        )
    if maximum is not None and value > maximum:
        raise ParameterInvalid(f"{key} should be at most {maximum}, actually was {value}")
    return value


def _enum(key: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ParameterInvalid(
            f"{key} should be one of {', '.join(allowed)}, actually was {_shown(value)}"
        )
    return str(value)


def _table(key: str, value: object) -> dict[str, object]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ParameterInvalid(f"{key} should be an object (a table), actually was {_shown(value)}")
    return dict(value)


def _delete_after(key: str, value: object) -> str | int:
    if isinstance(value, str) and value in DELETE_AFTER:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ParameterInvalid(
        f"{key} should be never, queue-length or a number of messages, actually was {_shown(value)}"
    )


def shovel_ends(definition: ShovelDefinition) -> dict[str, object]:
    """RabbitMQ's /api/shovels fields that name a shovel's source and destination: its
    first URIs with the passwords hidden, and its queues or exchanges."""
    fields: dict[str, object] = {
        "src_uri": redact_uri(definition.src_uris[0]),
        "dest_uri": redact_uri(definition.dest_uris[0]),
    }
    if definition.src_queue is not None:
        fields["src_queue"] = definition.src_queue
    else:
        fields["src_exchange"] = definition.src_exchange
        fields["src_exchange_key"] = definition.src_exchange_key
    if definition.dest_queue is not None:
        fields["dest_queue"] = definition.dest_queue
    if definition.dest_exchange is not None:
        fields["dest_exchange"] = definition.dest_exchange
    if definition.dest_exchange_key is not None:
        fields["dest_exchange_key"] = definition.dest_exchange_key
    return fields


def redact_uri(uri: str) -> str:
    """The URI with its password replaced by asterisks, for status pages and logs (as the
    links client shows it in errors); text that is not a URI comes back unchanged."""
    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:
        return uri
    if password is None:
        return uri
    user_info, _, host_part = parts.netloc.rpartition("@")
    user = user_info.partition(":")[0]
    netloc = f"{user}:{REDACTED}@{host_part}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_uri(key: str, uri: object, schemes: tuple[str, ...]) -> str:
    """A URI of one of `schemes`, checked for syntax (RabbitMQ's amqp URI spec: an empty
    host means this broker). Raises ParameterInvalid without the password in the text."""
    text = _text(key, uri)
    shown = redact_uri(text)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ParameterInvalid(f'{key}: "{shown}" is not a valid URI: {exc}') from None
    if parts.scheme.lower() not in schemes:
        raise ParameterInvalid(
            f'{key}: "{shown}" is not a valid URI: the scheme must be one of {", ".join(schemes)}'
        )
    if parts.scheme.lower() in HTTP_SCHEMES and not parts.hostname:
        raise ParameterInvalid(f'{key}: "{shown}" is not a valid URI: it has no host')
    if parts.fragment:
        raise ParameterInvalid(f'{key}: "{shown}" is not a valid URI: it has a fragment')
    if parts.scheme.lower() in AMQP_SCHEMES:
        for name, _ in parse_qsl(parts.query, keep_blank_values=True):
            if name not in URI_QUERY_KEYS:
                raise ParameterInvalid(f'{key}: "{shown}" has an unknown query parameter {name!r}')
    return text


def _uris(key: str, value: object, schemes: tuple[str, ...]) -> tuple[str, ...]:
    """One URI or a non-empty list of them, as RabbitMQ's src-uri, dest-uri and uri."""
    items = value if isinstance(value, list) else [value]
    if not items or len(items) > URIS_MAX:
        raise ParameterInvalid(f"{key} should be a URI or a list of 1 to {URIS_MAX} URIs")
    return tuple(check_uri(key, item, schemes) for item in items)


def _object(component: str, value: object) -> dict[str, object]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ParameterInvalid(f"the value of a {component} parameter should be a JSON object")
    return dict(value)


def _refuse_unknown(component: str, value: Mapping[str, object], known: frozenset[str]) -> None:
    unknown = sorted(k for k in value if k not in known)
    if unknown:
        raise ParameterInvalid(f"Unrecognised terms {unknown} in {component}")


# -- shovels ------------------------------------------------------------------------------

# Each accepted key: (dataclass field, check). Pre-3.7 names are RabbitMQ's aliases.
_SHOVEL_KEYS: Final[dict[str, str]] = {
    "src-protocol": "src_protocol",
    "dest-protocol": "dest_protocol",
    "src-uri": "src_uris",
    "src-queue": "src_queue",
    "src-exchange": "src_exchange",
    "src-exchange-key": "src_exchange_key",
    "src-prefetch-count": "src_prefetch_count",
    "prefetch-count": "src_prefetch_count",
    "src-delete-after": "src_delete_after",
    "delete-after": "src_delete_after",
    "src-consumer-args": "src_consumer_args",
    "src-queue-args": "src_queue_args",
    "dest-uri": "dest_uris",
    "dest-queue": "dest_queue",
    "dest-exchange": "dest_exchange",
    "dest-exchange-key": "dest_exchange_key",
    "dest-queue-args": "dest_queue_args",
    "dest-publish-properties": "dest_publish_properties",
    "publish-properties": "dest_publish_properties",
    "dest-add-forward-headers": "dest_add_forward_headers",
    "add-forward-headers": "dest_add_forward_headers",
    "dest-add-timestamp-header": "dest_add_timestamp_header",
    "add-timestamp-header": "dest_add_timestamp_header",
    "ack-mode": "ack_mode",
    "reconnect-delay": "reconnect_delay_s",
}


def _shovel_field(key: str, value: object) -> object:
    """The checked value of one shovel key, as its dataclass field holds it."""
    name = _SHOVEL_KEYS[key]
    if name.endswith("_protocol"):
        if value == "amqp10":
            raise ParameterInvalid(f"{key}: streamq shovels speak amqp091 only, not amqp10")
        return _enum(key, value, ("amqp091",))
    if name == "src_uris":
        return _uris(key, value, AMQP_SCHEMES)
    if name == "dest_uris":
        return _uris(key, value, AMQP_SCHEMES + HTTP_SCHEMES)
    if name == "src_prefetch_count":
        return _integer(key, value, PREFETCH_MAX)
    if name == "src_delete_after":
        return _delete_after(key, value)
    if name.endswith(("_args", "_properties")):
        return _table(key, value)
    if name.startswith("dest_add_"):
        return _flag(key, value)
    if name == "ack_mode":
        return _enum(key, value, ACK_MODES)
    if name == "reconnect_delay_s":
        return _number(key, value)
    return _text(key, value)


def shovel_definition(value: object) -> ShovelDefinition:
    """A shovel parameter's value (RabbitMQ's keys) as a definition. Raises
    ParameterInvalid naming the bad key."""
    body = _object(SHOVEL, value)
    _refuse_unknown(SHOVEL, body, frozenset(_SHOVEL_KEYS))
    fields = {_SHOVEL_KEYS[k]: _shovel_field(k, v) for k, v in body.items()}
    for key in ("src-uri", "dest-uri"):
        if key not in body:
            raise ParameterInvalid(f'Key "{key}" not found in {SHOVEL}')
    if "src_queue" in fields and "src_exchange" in fields:
        raise ParameterInvalid("Cannot specify 'src-exchange' and 'src-queue' in shovel")
    if "src_queue" not in fields and "src_exchange" not in fields:
        raise ParameterInvalid("Must specify 'src-exchange' or 'src-queue' in shovel")
    if "dest_queue" in fields and "dest_exchange" in fields:
        raise ParameterInvalid("Cannot specify 'dest-exchange' and 'dest-queue' in shovel")
    definition = ShovelDefinition(**fields)  # type: ignore[arg-type]
    if definition.dest_is_http and len(definition.dest_uris) > 1:
        raise ParameterInvalid("dest-uri: an http(s) destination takes one URI")
    return definition


# -- federation upstreams -----------------------------------------------------------------


def _upstream_value(key: str, value: object) -> object:
    """The checked value of one shared upstream key, as its dataclass field holds it."""
    if key in ("exchange", "queue", "consumer-tag"):
        return _text(key, value)
    if key == "prefetch-count":
        return _integer(key, value, PREFETCH_MAX)
    if key == "reconnect-delay":
        return _number(key, value)
    if key in ("max-hops", "expires", "message-ttl"):
        # max-hops 0 forwards nothing, but RabbitMQ accepts it: so do we, for its exports.
        return _integer(key, value)
    if key in ("trust-user-id", "bind-nowait"):
        return _flag(key, value)
    if key == "ack-mode":
        return _enum(key, value, ACK_MODES)
    if key == "queue-type":
        return _enum(key, value, ("classic", "quorum"))
    if key == "resource-cleanup-mode":
        return _enum(key, value, ("default", "never"))
    assert key == "channel-use-mode", key
    return _enum(key, value, ("multiple", "separate"))


# Keys an upstream and an upstream set member share, by dataclass field.
_SHARED_UPSTREAM_KEYS: Final[dict[str, str]] = {
    "exchange": "exchange",
    "queue": "queue",
    "consumer-tag": "consumer_tag",
    "prefetch-count": "prefetch_count",
    "reconnect-delay": "reconnect_delay_s",
    "ack-mode": "ack_mode",
    "trust-user-id": "trust_user_id",
    "max-hops": "max_hops",
    "expires": "expires_ms",
    "message-ttl": "message_ttl_ms",
    "queue-type": "queue_type",
    "bind-nowait": "bind_nowait",
    "resource-cleanup-mode": "resource_cleanup_mode",
    "channel-use-mode": "channel_use_mode",
}


def _shared_fields(body: Mapping[str, object]) -> dict[str, object]:
    """The dataclass fields of the shared keys in `body`, checked."""
    return {
        _SHARED_UPSTREAM_KEYS[k]: _upstream_value(k, v)
        for k, v in body.items()
        if k in _SHARED_UPSTREAM_KEYS
    }


def upstream_definition(value: object) -> UpstreamDefinition:
    """A federation-upstream parameter's value as a definition. Raises ParameterInvalid."""
    body = _object(UPSTREAM, value)
    _refuse_unknown(UPSTREAM, body, frozenset(_SHARED_UPSTREAM_KEYS) | {"uri", "ha-policy"})
    if "uri" not in body:
        raise ParameterInvalid(f'Key "uri" not found in {UPSTREAM}')
    fields = _shared_fields(body)
    if "ha-policy" in body:
        _text("ha-policy", body["ha-policy"])  # RabbitMQ's, for classic mirrored queues: unused
    return UpstreamDefinition(uris=_uris("uri", body["uri"], AMQP_SCHEMES), **fields)  # type: ignore[arg-type]


def upstream_set_definition(value: object) -> tuple[UpstreamSetMember, ...]:
    """A federation-upstream-set parameter's value: a list of `{"upstream": name, ...}`.
    Raises ParameterInvalid."""
    if not isinstance(value, list) or len(value) > UPSTREAM_SET_MEMBERS_MAX:
        raise ParameterInvalid(
            f"the value of a {UPSTREAM_SET} should be a list of up to "
            f'{UPSTREAM_SET_MEMBERS_MAX} objects with an "upstream" key'
        )
    members: list[UpstreamSetMember] = []
    for item in value:
        body = _object(UPSTREAM_SET, item)
        _refuse_unknown(UPSTREAM_SET, body, frozenset(_SHARED_UPSTREAM_KEYS) | {"upstream"})
        if "upstream" not in body:
            raise ParameterInvalid(f'Key "upstream" not found in {UPSTREAM_SET}')
        overrides = {k: v for k, v in body.items() if k != "upstream"}
        _shared_fields(overrides)
        members.append(UpstreamSetMember(_text("upstream", body["upstream"]), overrides))
    return tuple(members)


Definition = ShovelDefinition | UpstreamDefinition | tuple[UpstreamSetMember, ...]


def parse_value(component: str, value: object) -> Definition:
    """The definition of a parameter of `component` (one of COMPONENTS)."""
    if component == SHOVEL:
        return shovel_definition(value)
    if component == UPSTREAM:
        return upstream_definition(value)
    assert component == UPSTREAM_SET, component
    return upstream_set_definition(value)
