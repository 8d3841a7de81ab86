"""Exchanges and their bindings: who gets a message, by exchange type.

Owns routing for the types direct, fanout, topic and headers, the plugin types
`x-consistent-hash` (`consistent_hash.py`) and `x-delayed-message` (which routes as its
`x-delayed-type` once a message's delay is over; the vhost holds delayed messages), which
exchanges delay (that type, or LavinMQ's `x-delayed-exchange` argument or policy), the
exchange's deduplication cache (`dedup.py`), bindings to queues and to other exchanges,
and the equivalence rules of a redeclare. It does not know queues' contents, the log or
the protocol; the vhost follows exchange-to-exchange destinations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, NamedTuple

from streamq.broker.consistent_hash import HashRing, weight_of
from streamq.broker.dedup import Deduper, deduper_for
from streamq.broker.equivalence import EXCHANGE_CHECKED_ARGUMENTS, check_arguments, type_name
from streamq.broker.errors import CommandInvalid, PreconditionFailed
from streamq.broker.topic_trie import TopicTrie

CONSISTENT_HASH: Final = "x-consistent-hash"
DELAYED: Final = "x-delayed-message"
EXCHANGE_TYPES: Final = frozenset(
    {"direct", "fanout", "topic", "headers", CONSISTENT_HASH, DELAYED}
)
ROUTE_CACHE_ENTRIES_MAX: Final = 4096
X_MATCH_MODES: Final = ("all", "any", "all-with-x", "any-with-x")


class Destination(NamedTuple):
    kind: str  # "queue" or "exchange"
    name: str


class Binding(NamedTuple):
    destination: Destination
    routing_key: str
    arguments: tuple[tuple[str, object], ...]  # sorted items, so bindings compare by value


def freeze_arguments(arguments: Mapping[str, object]) -> tuple[tuple[str, object], ...]:
    return tuple(sorted((k, _hashable(v)) for k, v in arguments.items()))


def _hashable(value: object) -> object:
    if isinstance(value, dict):
        return freeze_arguments(value)
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


class Exchange:
    """An exchange and its bindings. `route` adds matching destinations to `out`."""

    def __init__(
        self,
        name: str,
        exchange_type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, object],
    ) -> None:
        if exchange_type not in EXCHANGE_TYPES:
            raise CommandInvalid(f"unknown exchange type '{exchange_type}'")
        self.name = name
        self.type = exchange_type
        # How it routes: its type, or a delayed exchange's x-delayed-type.
        self.route_type = delayed_type(arguments) if exchange_type == DELAYED else exchange_type
        self.hash_ring = HashRing(arguments) if self.route_type == CONSISTENT_HASH else None
        self.deduper: Deduper | None = deduper_for(arguments)
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments)
        # Who declared it (RabbitMQ's `user_who_performed_action`); "" when not known.
        self.user = ""
        self.bindings: set[Binding] = set()
        self.policy = {}  # the effective policy definition; sets the flags below
        # Routing key -> destination -> how many bindings (arguments differ) lead there:
        # an unbind updates it in place rather than rebuilding it from every binding.
        self._direct: dict[str, dict[Destination, int]] = {}
        self._topic: TopicTrie[Destination] = TopicTrie()
        self._cache: dict[str, frozenset[Destination]] = {}
        # Consistent hash: (destination, key, weight) in binding order.
        self._weighted: list[tuple[Destination, str, int]] = []

    @property
    def policy(self) -> dict[str, object]:
        return self._policy

    @policy.setter
    def policy(self, definition: dict[str, object]) -> None:
        """Set the effective policy and the flags that depend on it (LavinMQ's policy key
        `delayed-message` turns delaying on)."""
        self._policy = definition
        # LavinMQ's way: any type delays with the argument `x-delayed-exchange: true` or
        # the policy key `delayed-message: true`; a held message then counts as routed.
        self.delayed_lavinmq = self.type != DELAYED and (
            self.arguments.get("x-delayed-exchange") is True
            or definition.get("delayed-message") is True
        )
        self.delayed = self.type == DELAYED or self.delayed_lavinmq
        # Whether a publish must decode the message's properties before routing: the
        # hot path of the plain types skips the decode.
        self.reads_properties = (
            self.route_type == "headers"
            or self.delayed
            or self.deduper is not None
            or (self.hash_ring is not None and self.hash_ring.reads_properties)
        )

    @property
    def alternate_exchange(self) -> str | None:
        """By argument, else by policy (RabbitMQ: the argument wins)."""
        value = self.arguments.get("alternate-exchange", self.arguments.get("x-alternate-exchange"))
        if value is None:
            value = self.policy.get("alternate-exchange")
        return value if isinstance(value, str) else None

    def bind(
        self, destination: Destination, routing_key: str, arguments: Mapping[str, object]
    ) -> bool:
        """Add a binding; False if the same one existed."""
        if self.hash_ring is not None:
            weight_of(routing_key)  # raises for a key that is not a weight
        if self.route_type == "headers":
            check_headers_binding(arguments)
        binding = Binding(destination, routing_key, freeze_arguments(arguments))
        if binding in self.bindings:
            return False
        self.bindings.add(binding)
        by_destination = self._direct.setdefault(routing_key, {})
        by_destination[destination] = by_destination.get(destination, 0) + 1
        if self.route_type == "topic":
            self._topic.add(topic_words(routing_key), destination)
        self._cache.clear()
        if self.hash_ring is not None:
            self._weighted.append((destination, routing_key, weight_of(routing_key)))
            self.hash_ring.rebuild([(w[0], w[2]) for w in self._weighted])
        return True

    def unbind(
        self, destination: Destination, routing_key: str, arguments: Mapping[str, object]
    ) -> bool:
        binding = Binding(destination, routing_key, freeze_arguments(arguments))
        if binding not in self.bindings:
            return False
        self.bindings.discard(binding)
        self._forget(binding)
        self._after_unbind()
        return True

    def has_binding(
        self, destination: Destination, routing_key: str, arguments: Mapping[str, object]
    ) -> bool:
        return Binding(destination, routing_key, freeze_arguments(arguments)) in self.bindings

    def unbind_destination(self, destination: Destination) -> int:
        """Remove every binding to `destination` (it was deleted); returns how many."""
        gone = {b for b in self.bindings if b.destination == destination}
        self.bindings -= gone
        for binding in gone:
            self._forget(binding)
        if gone:
            self._after_unbind()
        return len(gone)

    def bindings_in_order(self) -> list[Binding]:
        """The bindings, a consistent hash exchange's in binding order (its ring depends
        on that order, so a snapshot of the definitions keeps it)."""
        if self.hash_ring is None:
            return list(self.bindings)
        rank = {(w[0], w[1]): n for n, w in enumerate(self._weighted)}
        return sorted(self.bindings, key=lambda b: rank.get((b.destination, b.routing_key), 0))

    def _forget(self, binding: Binding) -> None:
        """Take a binding just removed from `bindings` out of the routing indexes."""
        destination, routing_key = binding.destination, binding.routing_key
        by_destination = self._direct[routing_key]
        if by_destination[destination] > 1:
            by_destination[destination] -= 1
        else:
            del by_destination[destination]
            if not by_destination:
                del self._direct[routing_key]
        if self.route_type == "topic":
            self._topic.remove(topic_words(routing_key), destination)

    def _after_unbind(self) -> None:
        self._cache.clear()
        if self.hash_ring is not None:
            bound = {(b.destination, b.routing_key) for b in self.bindings}
            self._weighted = [w for w in self._weighted if (w[0], w[1]) in bound]
            self.hash_ring.rebuild([(w[0], w[2]) for w in self._weighted])

    def route(
        self,
        routing_key: str,
        headers: Mapping[str, object] | None,
        out: set[Destination],
        properties: Mapping[str, object] | None = None,
    ) -> None:
        """Hot path: add the destinations bound for this message to `out`. `properties`
        (message_id, correlation_id, timestamp) matter to `hash-property` only."""
        kind = self.route_type
        if kind == "direct":
            found = self._direct.get(routing_key)
            if found:
                out.update(found)
        elif kind == "fanout":
            out.update(b.destination for b in self.bindings)
        elif kind == "topic":
            out.update(self._route_topic(routing_key))
        elif kind == "headers":
            out.update(b.destination for b in self.bindings if headers_match(b.arguments, headers))
        else:
            assert self.hash_ring is not None
            picked = self.hash_ring.pick(routing_key, headers, properties)
            if isinstance(picked, Destination):
                out.add(picked)

    def _route_topic(self, routing_key: str) -> frozenset[Destination]:
        cached = self._cache.get(routing_key)
        if cached is None:
            cached = frozenset(self._topic.match(topic_words(routing_key)))
            if len(self._cache) >= ROUTE_CACHE_ENTRIES_MAX:
                self._cache.clear()
            self._cache[routing_key] = cached
        return cached

    def check_equivalent(
        self,
        exchange_type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, object],
        vhost: str,
    ) -> None:
        """Raise PreconditionFailed, in RabbitMQ's words, if a redeclare differs."""
        for field, current, received in (
            ("type", self.type, exchange_type),
            ("durable", self.durable, durable),
            ("auto_delete", self.auto_delete, auto_delete),
            ("internal", self.internal, internal),
        ):
            if current != received:
                raise PreconditionFailed(
                    f"inequivalent arg '{field}' for exchange '{self.name}' in vhost '{vhost}': "
                    f"received '{_show(received)}' but current is '{_show(current)}'"
                )
        check_arguments(
            "exchange", self.name, vhost, self.arguments, arguments, EXCHANGE_CHECKED_ARGUMENTS
        )


def delayed_type(arguments: Mapping[str, object]) -> str:
    """The type an `x-delayed-message` exchange routes as; raises as RabbitMQ's plugin
    (406, or 503 for a type that does not exist)."""
    inner = arguments.get("x-delayed-type")
    if isinstance(inner, bytes):
        inner = inner.decode("utf-8", "replace")
    if inner == DELAYED:
        raise PreconditionFailed(
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
        )
    if not isinstance(inner, str):
        raise PreconditionFailed(
            "Invalid argument, 'x-delayed-type' must be an existing exchange type"
        )
    if inner not in EXCHANGE_TYPES:
        raise CommandInvalid(f"unknown exchange type '{inner}'")
    return inner


def _show(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def topic_words(key: str) -> list[str]:
    """A routing or binding key's words, as RabbitMQ splits them (rabbit_exchange_type_topic,
    split_topic_key/1): on every ".", empty words kept ("a." is "a" and "", "a..b" three
    words), but the empty key is no word at all. So `#` and the empty binding key match
    the empty routing key and `*` does not; "".split(".") would make it one empty word."""
    return key.split(".") if key else []


def topic_match(pattern: list[str], words: list[str]) -> bool:
    """AMQP topic matching over `topic_words`: `*` is exactly one word (an empty word
    too), `#` zero or more words."""
    # Dynamic programming over (pattern prefix, words prefix); patterns are short.
    previous = [True] + [False] * len(words)
    for p in pattern:
        current = [previous[0] and p == "#"] + [False] * len(words)
        for j, word in enumerate(words, 1):
            if p == "#":
                current[j] = previous[j] or current[j - 1]
            elif p in ("*", word):
                current[j] = previous[j - 1]
        previous = current
    return previous[-1]


def check_headers_binding(arguments: Mapping[str, object]) -> None:
    """RabbitMQ's validate_binding of the headers exchange: raises PreconditionFailed
    (406) for an `x-match` that is not one of its modes, in RabbitMQ's words."""
    mode = arguments.get("x-match")
    if mode is None:
        return
    if not isinstance(mode, str):
        raise PreconditionFailed(
            f"Invalid x-match field type {type_name(mode)} (value {mode!r}); expected longstr"
        )
    if mode not in X_MATCH_MODES:
        # Erlang prints the binary value with ~p.
        raise PreconditionFailed(
            f'Invalid x-match field value <<"{mode}">>; expected all, any, all-with-x, '
            "or any-with-x"
        )


def headers_match(
    arguments: tuple[tuple[str, object], ...], headers: Mapping[str, object] | None
) -> bool:
    """RabbitMQ's headers exchange: `x-match` all (default), any, all-with-x, any-with-x.
    Binding keys starting with `x-` take no part unless the -with-x variants are used; a
    binding value of void (None) matches any value of a present header."""
    mode = "all"
    pairs = []
    for key, value in arguments:
        if key == "x-match":
            mode = str(value)
        else:
            pairs.append((key, value))
    with_x = mode.endswith("-with-x")
    if not with_x:
        pairs = [(k, v) for k, v in pairs if not k.startswith("x-")]
    headers = headers or {}
    results = (k in headers and (v is None or _hashable(headers[k]) == v) for k, v in pairs)
    if mode.startswith("any"):
        return any(results)
    return all(results)
