"""The AMQP 0-9-1 protocol as RabbitMQ implements it, as one declarative table.

This module owns the facts of the spec: class and method ids, field names in wire order,
their domains and wire types, which methods are synchronous or carry content, who sends
them and what answers them, and the basic content-header properties. It is the single
source from which `tools/gen_amqp_methods.py` generates `methods.py` and from which
`method_frame.py` encodes and decodes method payloads.

It follows RabbitMQ's `amqp-rabbitmq-0.9.1.json` rather than the bare OASIS XML:
- the RabbitMQ extensions are included: exchange.bind/unbind, basic.nack,
  confirm.select, connection.blocked/unblocked and connection.update-secret;
- `exchange.unbind-ok` is method 51, not 41, exactly as RabbitMQ numbers it;
- reserved fields carry RabbitMQ's names (`ticket`, `out-of-band`, `capabilities`,
  `insist`, `known-hosts`, `channel-id`, `cluster-id`) and `no-wait` is `nowait`;
- the deprecated `access` class (30) is kept, because old clients still send
  access.request and RabbitMQ answers it; RabbitMQ's internal basic.credit (60/200..202)
  is left out, since no 0-9-1 client sends it.

Rules:
1. Data only: no encoding logic, no I/O, nothing mutable after import.
2. Python names are derived mechanically (`routing-key` -> `routing_key`, a keyword
   gets a trailing underscore: `global` -> `global_`); the spec names stay here.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, NamedTuple


class Kind(StrEnum):
    """The wire types that domains resolve to (spec 4.2.5)."""

    BIT = "bit"
    OCTET = "octet"
    SHORT = "short"
    LONG = "long"
    LONGLONG = "longlong"
    SHORTSTR = "shortstr"
    LONGSTR = "longstr"
    TABLE = "table"
    TIMESTAMP = "timestamp"


class Sender(StrEnum):
    """Which peer may send a method (the spec's `chassis` elements)."""

    CLIENT = "client"
    SERVER = "server"
    BOTH = "both"


DOMAINS: Final[Mapping[str, Kind]] = {
    **{kind.value: kind for kind in Kind},
    "access-ticket": Kind.SHORT,
    "channel-id": Kind.LONGSTR,
    "class-id": Kind.SHORT,
    "consumer-tag": Kind.SHORTSTR,
    "delivery-tag": Kind.LONGLONG,
    "exchange-name": Kind.SHORTSTR,
    "message-count": Kind.LONG,
    "method-id": Kind.SHORT,
    "no-ack": Kind.BIT,
    "no-local": Kind.BIT,
    "no-wait": Kind.BIT,
    "path": Kind.SHORTSTR,
    "peer-properties": Kind.TABLE,
    "queue-name": Kind.SHORTSTR,
    "redelivered": Kind.BIT,
    "reply-code": Kind.SHORT,
    "reply-text": Kind.SHORTSTR,
}
"""Spec domain name -> wire type."""

FieldDefault = bool | int | str | bytes | None


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One method argument or content property. `default` None means the kind's zero."""

    spec_name: str
    domain: str
    default: FieldDefault = None

    @property
    def name(self) -> str:
        """The Python attribute name."""
        name = self.spec_name.replace("-", "_")
        return name + "_" if keyword.iskeyword(name) else name

    @property
    def kind(self) -> Kind:
        return DOMAINS[self.domain]


@dataclass(frozen=True, slots=True)
class MethodSpec:
    class_id: int
    method_id: int
    class_name: str
    spec_name: str
    fields: tuple[FieldSpec, ...]
    synchronous: bool
    content: bool
    sender: Sender
    responses: tuple[str, ...]
    """Spec names of the methods in the same class that answer this one."""

    @property
    def full_name(self) -> str:
        """The dotted spec name, e.g. `basic.publish` (as in RabbitMQ's logs)."""
        return f"{self.class_name}.{self.spec_name}"

    @property
    def python_name(self) -> str:
        """The generated dataclass name, e.g. `BasicPublish`, `ExchangeDeclareOk`."""
        words = [self.class_name, *self.spec_name.split("-")]
        return "".join(word.capitalize() for word in words)


@dataclass(frozen=True, slots=True)
class ClassSpec:
    class_id: int
    name: str
    methods: tuple[MethodSpec, ...]


class _Row(NamedTuple):
    method_id: int
    spec_name: str
    sender: Sender
    fields: tuple[FieldSpec, ...]
    synchronous: bool
    content: bool
    responses: tuple[str, ...]


C, S, B = Sender.CLIENT, Sender.SERVER, Sender.BOTH


def _m(
    method_id: int,
    spec_name: str,
    sender: Sender,
    *fields: FieldSpec,
    sync: bool = False,
    content: bool = False,
    responses: tuple[str, ...] = (),
) -> _Row:
    return _Row(method_id, spec_name, sender, fields, sync, content, responses)


def _f(spec_name: str, domain: str | None = None, default: FieldDefault = None) -> FieldSpec:
    """A field whose domain is its own name unless given (as in the spec's XML)."""
    return FieldSpec(spec_name, domain or spec_name, default)


def _class(class_id: int, name: str, *rows: _Row) -> ClassSpec:
    methods = tuple(
        MethodSpec(
            class_id,
            row.method_id,
            name,
            row.spec_name,
            row.fields,
            row.synchronous,
            row.content,
            row.sender,
            row.responses,
        )
        for row in rows
    )
    return ClassSpec(class_id, name, methods)


_TICKET = _f("ticket", "access-ticket")
_CLOSE_FIELDS = (_f("reply-code"), _f("reply-text"), _f("class-id"), _f("method-id"))
_TUNE_FIELDS = (_f("channel-max", "short"), _f("frame-max", "long"), _f("heartbeat", "short"))
_EXCHANGE_BIND_FIELDS = (
    _TICKET,
    _f("destination", "exchange-name"),
    _f("source", "exchange-name"),
    _f("routing-key", "shortstr"),
    _f("nowait", "no-wait"),
    _f("arguments", "table"),
)

# The table is laid out by hand, one method per call, so the formatter leaves it alone.
# fmt: off
CLASSES: Final[tuple[ClassSpec, ...]] = (
    _class(
        10,
        "connection",
        _m(
            10, "start", S,
            _f("version-major", "octet", 0), _f("version-minor", "octet", 9),
            _f("server-properties", "peer-properties"),
            _f("mechanisms", "longstr", b"PLAIN"), _f("locales", "longstr", b"en_US"),
            sync=True, responses=("start-ok",),
        ),
        _m(
            11, "start-ok", C,
            _f("client-properties", "peer-properties"), _f("mechanism", "shortstr", "PLAIN"),
            _f("response", "longstr"), _f("locale", "shortstr", "en_US"),
        ),
        _m(20, "secure", S, _f("challenge", "longstr"), sync=True, responses=("secure-ok",)),
        _m(21, "secure-ok", C, _f("response", "longstr")),
        _m(30, "tune", S, *_TUNE_FIELDS, sync=True, responses=("tune-ok",)),
        _m(31, "tune-ok", C, *_TUNE_FIELDS),
        _m(
            40, "open", C,
            _f("virtual-host", "path", "/"), _f("capabilities", "shortstr"),
            _f("insist", "bit"),
            sync=True, responses=("open-ok",),
        ),
        _m(41, "open-ok", S, _f("known-hosts", "shortstr")),
        _m(50, "close", B, *_CLOSE_FIELDS, sync=True, responses=("close-ok",)),
        _m(51, "close-ok", B),
        _m(60, "blocked", S, _f("reason", "shortstr")),
        _m(61, "unblocked", S),
        _m(
            70, "update-secret", C,
            _f("new-secret", "longstr"), _f("reason", "shortstr"),
            sync=True, responses=("update-secret-ok",),
        ),
        _m(71, "update-secret-ok", S),
    ),
    _class(
        20,
        "channel",
        _m(10, "open", C, _f("out-of-band", "shortstr"), sync=True, responses=("open-ok",)),
        _m(11, "open-ok", S, _f("channel-id", "longstr")),
        _m(20, "flow", B, _f("active", "bit"), sync=True, responses=("flow-ok",)),
        _m(21, "flow-ok", B, _f("active", "bit")),
        _m(40, "close", B, *_CLOSE_FIELDS, sync=True, responses=("close-ok",)),
        _m(41, "close-ok", B),
    ),
    _class(
        30,
        "access",
        _m(
            10, "request", C,
            _f("realm", "shortstr", "/data"), _f("exclusive", "bit"), _f("passive", "bit", True),
            _f("active", "bit", True), _f("write", "bit", True), _f("read", "bit", True),
            sync=True, responses=("request-ok",),
        ),
        _m(11, "request-ok", S, _f("ticket", "short", 1)),
    ),
    _class(
        40,
        "exchange",
        _m(
            10, "declare", C,
            _TICKET, _f("exchange", "exchange-name"), _f("type", "shortstr", "direct"),
            _f("passive", "bit"), _f("durable", "bit"), _f("auto-delete", "bit"),
            _f("internal", "bit"), _f("nowait", "no-wait"), _f("arguments", "table"),
            sync=True, responses=("declare-ok",),
        ),
        _m(11, "declare-ok", S),
        _m(
            20, "delete", C,
            _TICKET, _f("exchange", "exchange-name"), _f("if-unused", "bit"),
            _f("nowait", "no-wait"),
            sync=True, responses=("delete-ok",),
        ),
        _m(21, "delete-ok", S),
        _m(30, "bind", C, *_EXCHANGE_BIND_FIELDS, sync=True, responses=("bind-ok",)),
        _m(31, "bind-ok", S),
        _m(40, "unbind", C, *_EXCHANGE_BIND_FIELDS, sync=True, responses=("unbind-ok",)),
        # RabbitMQ numbers unbind-ok 51, not 41 (rabbit_framing_amqp_0_9_1: {40, 51}).
        _m(51, "unbind-ok", S),
    ),
    _class(
        50,
        "queue",
        _m(
            10, "declare", C,
            _TICKET, _f("queue", "queue-name"), _f("passive", "bit"), _f("durable", "bit"),
            _f("exclusive", "bit"), _f("auto-delete", "bit"), _f("nowait", "no-wait"),
            _f("arguments", "table"),
            sync=True, responses=("declare-ok",),
        ),
        _m(
            11, "declare-ok", S,
            _f("queue", "queue-name"), _f("message-count"), _f("consumer-count", "long"),
        ),
        _m(
            20, "bind", C,
            _TICKET, _f("queue", "queue-name"), _f("exchange", "exchange-name"),
            _f("routing-key", "shortstr"), _f("nowait", "no-wait"), _f("arguments", "table"),
            sync=True, responses=("bind-ok",),
        ),
        _m(21, "bind-ok", S),
        _m(
            30, "purge", C,
            _TICKET, _f("queue", "queue-name"), _f("nowait", "no-wait"),
            sync=True, responses=("purge-ok",),
        ),
        _m(31, "purge-ok", S, _f("message-count")),
        _m(
            40, "delete", C,
            _TICKET, _f("queue", "queue-name"), _f("if-unused", "bit"), _f("if-empty", "bit"),
            _f("nowait", "no-wait"),
            sync=True, responses=("delete-ok",),
        ),
        _m(41, "delete-ok", S, _f("message-count")),
        _m(
            50, "unbind", C,
            _TICKET, _f("queue", "queue-name"), _f("exchange", "exchange-name"),
            _f("routing-key", "shortstr"), _f("arguments", "table"),
            sync=True, responses=("unbind-ok",),
        ),
        _m(51, "unbind-ok", S),
    ),
    _class(
        60,
        "basic",
        _m(
            10, "qos", C,
            _f("prefetch-size", "long"), _f("prefetch-count", "short"), _f("global", "bit"),
            sync=True, responses=("qos-ok",),
        ),
        _m(11, "qos-ok", S),
        _m(
            20, "consume", C,
            _TICKET, _f("queue", "queue-name"), _f("consumer-tag"), _f("no-local"),
            _f("no-ack"), _f("exclusive", "bit"), _f("nowait", "no-wait"),
            _f("arguments", "table"),
            sync=True, responses=("consume-ok",),
        ),
        _m(21, "consume-ok", S, _f("consumer-tag")),
        # The server also sends basic.cancel, when a queue goes away (RabbitMQ's
        # consumer_cancel_notify capability).
        _m(
            30, "cancel", B,
            _f("consumer-tag"), _f("nowait", "no-wait"),
            sync=True, responses=("cancel-ok",),
        ),
        _m(31, "cancel-ok", B, _f("consumer-tag")),
        _m(
            40, "publish", C,
            _TICKET, _f("exchange", "exchange-name"), _f("routing-key", "shortstr"),
            _f("mandatory", "bit"), _f("immediate", "bit"),
            content=True,
        ),
        _m(
            50, "return", S,
            _f("reply-code"), _f("reply-text"), _f("exchange", "exchange-name"),
            _f("routing-key", "shortstr"),
            content=True,
        ),
        _m(
            60, "deliver", S,
            _f("consumer-tag"), _f("delivery-tag"), _f("redelivered"),
            _f("exchange", "exchange-name"), _f("routing-key", "shortstr"),
            content=True,
        ),
        _m(
            70, "get", C,
            _TICKET, _f("queue", "queue-name"), _f("no-ack"),
            sync=True, responses=("get-ok", "get-empty"),
        ),
        _m(
            71, "get-ok", S,
            _f("delivery-tag"), _f("redelivered"), _f("exchange", "exchange-name"),
            _f("routing-key", "shortstr"), _f("message-count"),
            content=True,
        ),
        _m(72, "get-empty", S, _f("cluster-id", "shortstr")),
        # The server sends ack and nack too, as publisher confirms.
        _m(80, "ack", B, _f("delivery-tag"), _f("multiple", "bit")),
        _m(90, "reject", C, _f("delivery-tag"), _f("requeue", "bit", True)),
        _m(100, "recover-async", C, _f("requeue", "bit")),
        _m(110, "recover", C, _f("requeue", "bit"), sync=True, responses=("recover-ok",)),
        _m(111, "recover-ok", S),
        _m(
            120, "nack", B,
            _f("delivery-tag"), _f("multiple", "bit"), _f("requeue", "bit", True),
        ),
    ),
    _class(
        90,
        "tx",
        _m(10, "select", C, sync=True, responses=("select-ok",)),
        _m(11, "select-ok", S),
        _m(20, "commit", C, sync=True, responses=("commit-ok",)),
        _m(21, "commit-ok", S),
        _m(30, "rollback", C, sync=True, responses=("rollback-ok",)),
        _m(31, "rollback-ok", S),
    ),
    _class(
        85,
        "confirm",
        _m(10, "select", C, _f("nowait", "no-wait"), sync=True, responses=("select-ok",)),
        _m(11, "select-ok", S),
    ),
)
# fmt: on

METHODS: Final[Mapping[tuple[int, int], MethodSpec]] = {
    (method.class_id, method.method_id): method for cls in CLASSES for method in cls.methods
}
"""(class_id, method_id) -> MethodSpec, for every method above."""

BASIC_CLASS_ID: Final = 60

BASIC_PROPERTIES: Final[tuple[FieldSpec, ...]] = (
    _f("content-type", "shortstr"),
    _f("content-encoding", "shortstr"),
    _f("headers", "table"),
    _f("delivery-mode", "octet"),
    _f("priority", "octet"),
    _f("correlation-id", "shortstr"),
    _f("reply-to", "shortstr"),
    _f("expiration", "shortstr"),
    _f("message-id", "shortstr"),
    _f("timestamp", "timestamp"),
    _f("type", "shortstr"),
    _f("user-id", "shortstr"),
    _f("app-id", "shortstr"),
    _f("cluster-id", "shortstr"),
)
"""The basic class's content properties in flag order: the first is flag bit 15."""
