"""A vhost's routing: the queues a message goes to, through its exchanges.

Owns the walk from the exchange a message is published to, through exchange-to-exchange
bindings and alternate exchanges (`ROUTE_DEPTH_MAX` hops at most, each exchange once),
to the queues that take it (`Exchange.route` matches one exchange's bindings), over the
registry of `Entities`, which it reads and never changes. It also holds the gateway's
two helpers for AMQP properties, which the broker core does not parse:
`decode_for_route` (headers and properties, decoded only when a route reaches an
exchange that reads them) and `properties_codec` (read and written for expirations and
dead letters' `x-death`, by the settling components above this one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, TypeAlias

from streamq.broker.deadletter import PropertiesCodec
from streamq.broker.exchange import Destination, Exchange
from streamq.broker.queue import Queue
from streamq.broker.vhost_entities import Entities

ROUTE_DEPTH_MAX: Final = 64  # exchange-to-exchange hops followed for one message

# A message's headers and the properties `hash-property` reads (None: unknown or absent).
RouteFields: TypeAlias = tuple[Mapping[str, object] | None, Mapping[str, object] | None]


class Router:
    """Routing over the exchanges and queues of one vhost."""

    __slots__ = ("decode_for_route", "exchange", "exchanges", "properties_codec", "queues")

    def __init__(self, entities: Entities) -> None:
        # The registry's dicts and lookup, read only (one attribute away on every route).
        self.exchanges: Mapping[str, Exchange] = entities.exchanges
        self.queues: Mapping[str, Queue] = entities.queues
        self.exchange = entities.exchange
        # The gateway's decoder of (headers, properties) from raw properties, for a route
        # that reaches an exchange reading them.
        self.decode_for_route: Callable[[bytes], RouteFields] = _no_fields
        # The gateway's reader and writer of AMQP properties, for TTL and dead letters.
        self.properties_codec: PropertiesCodec | None = None

    def route(
        self,
        exchange_name: str,
        routing_key: str,
        headers: Mapping[str, object] | None,
        properties: Mapping[str, object] | None = None,
        properties_raw: bytes | None = None,
    ) -> list[Queue]:
        """The queues a message goes to. Raises NotFound for a missing exchange.
        `properties` matter to consistent hash exchanges with `hash-property` only.
        A caller that has not decoded the message passes `properties_raw` instead: the
        headers and properties are decoded from it (once) if the route reaches an
        exchange that reads them, say a headers exchange bound to a direct one."""
        queues = self._route(exchange_name, routing_key, headers, properties, properties_raw)
        assert queues is not None  # only a run's route declines to read properties
        return queues

    def route_run(self, exchange_name: str, routing_key: str) -> list[Queue] | None:
        """`route` for a run of messages with this exchange and routing key: None when
        an exchange on the route reads properties (each message must route on its own)."""
        return self._route(exchange_name, routing_key, None, None, None, run=True)

    def _route(
        self,
        exchange_name: str,
        routing_key: str,
        headers: Mapping[str, object] | None,
        properties: Mapping[str, object] | None,
        properties_raw: bytes | None,
        *,
        run: bool = False,
    ) -> list[Queue] | None:
        if exchange_name == "":
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None and queue.failed is None else []
        start = self.exchange(exchange_name)
        found: set[Destination] = set()
        seen = {exchange_name}
        pending = [start]
        depth = 0
        while pending and depth < ROUTE_DEPTH_MAX:
            exchange = pending.pop()
            depth += 1
            if exchange.reads_properties:
                if run:
                    return None
                if properties_raw:
                    headers, properties = self.decode_for_route(properties_raw)
                    properties_raw = None
            matched: set[Destination] = set()
            exchange.route(routing_key, headers, matched, properties)
            if not matched and exchange.alternate_exchange not in (None, *seen):
                alternate = self.exchanges.get(exchange.alternate_exchange or "")
                if alternate is not None:
                    seen.add(alternate.name)
                    pending.append(alternate)
            for destination in matched:
                if destination.kind == "queue":
                    found.add(destination)
                elif destination.name not in seen:
                    seen.add(destination.name)
                    target = self.exchanges.get(destination.name)
                    if target is not None:
                        pending.append(target)
        queues = self.queues
        return [queues[d.name] for d in found if d.name in queues and queues[d.name].failed is None]

    def dead_letter_route(self, exchange_name: str) -> Callable[[str, bytes], list[Queue]]:
        """Routing on a dead-letter exchange by routing key and properties."""
        return lambda key, properties: self.route(
            exchange_name, key, None, properties_raw=properties
        )


def _no_fields(properties_raw: bytes) -> RouteFields:
    return None, None
