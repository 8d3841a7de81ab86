"""The consistent hash exchange (`x-consistent-hash`), as RabbitMQ's plugin routes.

Owns the choice of one destination per message: each binding's key is its weight (an
integer, at least 1) and gives it that many buckets; a message goes to the bucket that a
jump consistent hash (Lamping and Veach) picks from the hash of its routing key, of the
header named by the exchange argument `hash-header`, or of the property named by
`hash-property` (`message_id`, `correlation_id`, `timestamp`). A key always lands on the
same destination while the bindings stay, and adding a binding moves only the keys that
its new buckets take. It does not read AMQP properties: the caller hands them over.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Final

from streamq.broker.errors import PreconditionFailed

HASH_PROPERTIES: Final = ("message_id", "correlation_id", "timestamp")
_JUMP_MULTIPLIER: Final = 2862933555777941757
_MASK_64: Final = (1 << 64) - 1


def check_hash_arguments(arguments: Mapping[str, object]) -> None:
    """RabbitMQ's 406 for exchange arguments the plugin cannot use."""
    header = arguments.get("hash-header")
    prop = arguments.get("hash-property")
    if header is not None and prop is not None:
        raise PreconditionFailed(
            "hash-header and hash-property are mutually exclusive, only one can be specified"
        )
    if header is not None and not isinstance(header, str):
        raise PreconditionFailed(f"hash-header must be a string, got {header!r}")
    if prop is not None and prop not in HASH_PROPERTIES:
        raise PreconditionFailed(f"Unsupported property: {prop}")


def weight_of(routing_key: str) -> int:
    """A binding's weight; raises PreconditionFailed in the plugin's words."""
    try:
        weight = int(routing_key)
    except ValueError:
        raise PreconditionFailed(
            f'The binding key must be an integer: <<"{routing_key}">>'
        ) from None
    if weight < 1:
        raise PreconditionFailed("The binding key must be greater than 0")
    return weight


def jump_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: a bucket in [0, buckets)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * _JUMP_MULTIPLIER + 1) & _MASK_64
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def hash_key(value: object) -> int:
    """A stable 64-bit hash of a routing key, header or property value."""
    if isinstance(value, bytes):
        data = value
    elif value is None:
        data = b"\x00undefined"  # RabbitMQ hashes a missing value too: one fixed bucket
    else:
        data = str(value).encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class HashRing:
    """The buckets of one exchange, rebuilt when its bindings change."""

    __slots__ = ("_buckets", "header", "prop")

    def __init__(self, arguments: Mapping[str, object]) -> None:
        check_hash_arguments(arguments)
        header = arguments.get("hash-header")
        prop = arguments.get("hash-property")
        self.header = header if isinstance(header, str) else None
        self.prop = prop if isinstance(prop, str) else None
        self._buckets: list[object] = []

    @property
    def reads_properties(self) -> bool:
        return self.header is not None or self.prop is not None

    def rebuild(self, weighted: list[tuple[object, int]]) -> None:
        """`weighted`: (destination, weight) in binding order."""
        self._buckets = [d for d, weight in weighted for _ in range(weight)]

    def pick(
        self,
        routing_key: str,
        headers: Mapping[str, object] | None,
        properties: Mapping[str, object] | None,
    ) -> object | None:
        buckets = self._buckets
        if not buckets:
            return None
        if self.header is not None:
            value = (headers or {}).get(self.header)
        elif self.prop is not None:
            value = (properties or {}).get(self.prop)
        else:
            value = routing_key
        return buckets[jump_hash(hash_key(value), len(buckets))]
