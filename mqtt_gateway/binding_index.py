"""An index of the MQTT subscription queues' bindings to `amq.topic`, by queue and member.

Owns `BindingIndex`: for one vhost, queue name -> the bindings of that MQTT queue
(`mqtt-subscription-...`, `mqtt-shared-...`), and shared-group member (client id) ->
the shared queues it has bindings in. The exchange keeps its bindings in one set with no
lookup by destination, so without this a SUBSCRIBE or a CONNECT would scan every binding
of `amq.topic`: O(bindings) each, O(n^2) for n clients subscribing. Built once per vhost
by one scan (the bindings a restart replayed from the journal), then kept by the
gateway's own binds and unbinds (`subscriptions.py` makes them all). What others change
(an AMQP client unbinding an MQTT queue, an operator deleting one) is caught on read:
every binding returned is checked against the exchange (`has_binding`, O(1)) and
forgotten if gone. A binding another client adds to an MQTT queue is not indexed: it
routes as any binding, its deliveries go out with no options. Costs one entry per MQTT
binding; the entries of a persistent session's queue that expired stay until that
client id connects again. It touches no socket and knows no packets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from mqtt_gateway import mapping
from mqtt_gateway.subscription_options import ARG_MEMBER
from streamq.broker.exchange import Binding

if TYPE_CHECKING:
    from streamq.broker.vhost import VHost

QUEUE_PREFIXES: Final = (mapping.QUEUE_PREFIX, mapping.SHARED_QUEUE_PREFIX)


class BindingIndex:
    """The bindings of one vhost's MQTT queues to `amq.topic`."""

    __slots__ = ("by_member", "by_queue")

    def __init__(self, vhost: VHost) -> None:
        self.by_queue: dict[str, set[Binding]] = {}
        self.by_member: dict[str, set[str]] = {}
        exchange = vhost.exchanges.get(mapping.EXCHANGE)
        if exchange is not None:
            for binding in exchange.bindings:
                destination = binding.destination
                if destination.kind == "queue" and destination.name.startswith(QUEUE_PREFIXES):
                    self.add(binding)

    def add(self, binding: Binding) -> None:
        name = binding.destination.name
        self.by_queue.setdefault(name, set()).add(binding)
        member = dict(binding.arguments).get(ARG_MEMBER)
        if isinstance(member, str):
            self.by_member.setdefault(member, set()).add(name)

    def remove(self, binding: Binding) -> None:
        name = binding.destination.name
        held = self.by_queue.get(name)
        if held is not None:
            held.discard(binding)
            if not held:
                del self.by_queue[name]
        member = dict(binding.arguments).get(ARG_MEMBER)
        if isinstance(member, str) and not self.of_member_in(name, member):
            queues = self.by_member.get(member)
            if queues is not None:
                queues.discard(name)
                if not queues:
                    del self.by_member[member]

    def drop_queue(self, name: str) -> None:
        """The queue is gone (deleted with its bindings): forget them."""
        for binding in list(self.by_queue.get(name, ())):
            self.remove(binding)

    def of_member_in(self, name: str, member: str) -> list[Binding]:
        """The bindings of a shared queue naming `member` (not checked)."""
        return [
            b for b in self.by_queue.get(name, ()) if dict(b.arguments).get(ARG_MEMBER) == member
        ]

    def of(self, vhost: VHost, name: str, routing_key: str | None = None) -> list[Binding]:
        """The queue's bindings (with `routing_key` only, if given), each still on the
        exchange; those gone meanwhile are forgotten."""
        held = self.by_queue.get(name)
        if not held:
            return []
        exchange = vhost.exchanges.get(mapping.EXCHANGE)
        found = []
        for binding in list(held):
            if routing_key is not None and binding.routing_key != routing_key:
                continue
            if exchange is not None and exchange.has_binding(
                binding.destination, binding.routing_key, dict(binding.arguments)
            ):
                found.append(binding)
            else:
                self.remove(binding)
        return found

    def memberships(self, vhost: VHost, member: str) -> list[tuple[str, Binding]]:
        """The (shared queue, binding) of each of a member's shared subscriptions."""
        found: list[tuple[str, Binding]] = []
        for name in sorted(self.by_member.get(member, ())):
            found.extend((name, b) for b in self.of(vhost, name) if _member(b) == member)
        return found


def _member(binding: Binding) -> object:
    return dict(binding.arguments).get(ARG_MEMBER)
