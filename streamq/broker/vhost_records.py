"""A vhost's entities in its definitions journal: replaying their records at start-up and
the snapshot that compacts the journal.

Owns the translation between the journal's records of exchanges, queues and bindings
(`vhost_store.exchange_op`, `queue_op`, `binding_op` make them as `Entities` records each
change) and the registry of `Entities`: a record is a change, applied without side
effects (no listener, no policy, no journal: those follow once everything is restored).
Policies and runtime parameters replay their own records (`PolicySet.restore`,
`RuntimeParameters.restore`); `VHost` hands each record to its owner.
"""

from __future__ import annotations

import logging

from streamq.broker.definitions import DefinitionsCorrupted, Op, arguments_from_json
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Destination, Exchange
from streamq.broker.queue import Queue
from streamq.broker.vhost_entities import Entities
from streamq.broker.vhost_store import PREDECLARED_NAMES, binding_op, exchange_op, queue_op

logger = logging.getLogger(__name__)


def restore(entities: Entities, op: Op) -> None:
    """Replay one definitions record of an exchange, a queue or a binding: a change,
    applied without side effects (start-up only). Raises DefinitionsCorrupted."""
    kind = op["op"]
    name = str(op.get("name", ""))
    if kind == "exchange":
        try:
            exchange = Exchange(
                name,
                str(op["type"]),
                True,
                bool(op.get("auto_delete")),
                bool(op.get("internal")),
                arguments_from_json(op.get("arguments")),
            )
            exchange.user = str(op.get("user", ""))  # absent from older journals
            entities.exchanges[name] = exchange
        except BrokerError as exc:
            logger.error("vhost %s: cannot restore exchange %r: %s", entities.name, name, exc)
    elif kind == "exchange.delete":
        entities.drop_exchange(name)
    elif kind == "queue":
        entities.queues[name] = Queue(
            name,
            True,
            None,
            bool(op.get("auto_delete")),
            arguments_from_json(op.get("arguments")),
        )
    elif kind == "queue.delete":
        if entities.queues.pop(name, None) is not None:
            entities.unbind_everywhere(Destination("queue", name))
    elif kind in ("bind", "unbind"):
        source = entities.exchanges.get(str(op.get("source")))
        destination = Destination(str(op.get("kind")), str(op.get("destination")))
        if source is None or not entities.exists(destination):
            return
        arguments = arguments_from_json(op.get("arguments"))
        if kind == "bind":
            source.bind(destination, str(op.get("routing_key")), arguments)
        else:
            source.unbind(destination, str(op.get("routing_key")), arguments)
    else:
        raise DefinitionsCorrupted(entities.definitions.path, 0, f"unknown op {kind!r}")


def entity_ops(entities: Entities) -> list[Op]:
    """The definitions records that recreate every durable exchange, queue and
    binding as it is now."""
    ops: list[Op] = [
        exchange_op(e)
        for e in entities.exchanges.values()
        if e.durable and e.name not in PREDECLARED_NAMES
    ]
    ops += [queue_op(q) for q in entities.queues.values() if q.persisted]
    for exchange in entities.exchanges.values():
        if exchange.durable:
            ops += [
                binding_op("bind", exchange.name, b.destination, b.routing_key, dict(b.arguments))
                for b in exchange.bindings_in_order()
                if entities.persisted(b.destination)
            ]
    return ops
