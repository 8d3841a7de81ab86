"""Redeclare equivalence: which arguments must match, and RabbitMQ's words when not.

Owns the comparison of a redeclared queue's or exchange's arguments with the current
ones. As RabbitMQ (`rabbit_misc:assert_args_equivalence`), only the arguments the broker
gives a meaning to are compared; any other may differ. The error texts are RabbitMQ's,
value formatting included, since clients and their tests match on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Final

from streamq.broker.errors import PreconditionFailed

# rabbit_amqqueue:declare_args() and rabbit_stream_queue's, as of RabbitMQ 3.10, and
# x-consumer-timeout (RabbitMQ 3.12).
QUEUE_CHECKED_ARGUMENTS: Final = frozenset(
    {
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-consumer-timeout",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
        "x-queue-master-locator",
    }
)
EXCHANGE_CHECKED_ARGUMENTS: Final = frozenset({"alternate-exchange"})

# AMQP field type names as RabbitMQ prints them, by the Python type the codec decodes to
# (the codec's marker classes are named after the wire type; plain types map directly).
_TYPE_NAMES: Final = {
    "bool": "bool",
    "int": "signedint",
    "Int8": "byte",
    "UInt8": "unsignedbyte",
    "Int16": "short",
    "UInt16": "unsignedshort",
    "UInt32": "unsignedint",
    "Int64": "long",
    "Timestamp": "timestamp",
    "float": "double",
    "Float32": "float",
    "Decimal": "decimal",
    "str": "longstr",
    "bytes": "binary",
    "dict": "table",
    "list": "array",
    "NoneType": "void",
}


def check_arguments(
    kind: str,
    name: str,
    vhost: str,
    current: Mapping[str, object],
    received: Mapping[str, object],
    checked: frozenset[str],
) -> None:
    """Raise PreconditionFailed, in RabbitMQ's words, if a checked argument differs."""
    for key in sorted(checked & (current.keys() | received.keys())):
        old = current.get(key, _MISSING)
        new = received.get(key, _MISSING)
        if old is _MISSING or new is _MISSING:
            raise PreconditionFailed(
                f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': "
                f"received {_typed(new)} but current is {_typed(old)}"
            )
        if not _same(old, new):
            raise PreconditionFailed(
                f"inequivalent arg '{key}' for {kind} '{name}' in vhost '{vhost}': "
                f"received '{_plain(new)}' but current is '{_plain(old)}'"
            )


_MISSING: Final = object()


def _same(old: object, new: object) -> bool:
    # RabbitMQ (rabbit_misc:assert_args_equivalence1) compares values within a type class
    # (any integer type with any other, float with double), else the bare Erlang terms:
    # a longstr and a binary of the same bytes are the same, an integer and a float never.
    return _term(old) == _term(new)


def _term(value: object) -> object:
    """`value` as its Erlang term compares: tagged with its type class."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    for kind in (bool, int, float, Decimal):  # bool first: it is an int too
        if isinstance(value, kind):
            return (kind.__name__, value)
    return value


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def type_name(value: object) -> str:
    """The AMQP field type of a decoded value, as RabbitMQ names it ("longstr")."""
    return _TYPE_NAMES.get(type(value).__name__, type(value).__name__)


def _typed(value: object) -> str:
    if value is _MISSING:
        return "none"
    return f"the value '{_plain(value)}' of type '{type_name(value)}'"
