"""A vhost's publish-side extras: delayed messages and queue deduplication caches.

Owns the vhost's `DelayedStore` (messages of `x-delayed-message` exchanges that wait out
their `x-delay`, `delayed.py`) and the deduplication caches of queues declared with
`x-message-deduplication` (`dedup.py`; an exchange keeps its own). `VHost` mixes it in.
It does not route or decode messages: the gateway reads headers and routes what comes
due, so that everything a publish does (CC/BCC, alternate exchanges) applies then too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import TypeAlias

from streamq.broker.dedup import Deduper, deduper_for
from streamq.broker.delayed import DelayedMessage, DelayedStore
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Exchange
from streamq.broker.queue import Queue
from streamq.log.log import SegmentLog

logger = logging.getLogger(__name__)

# A message's headers and the properties `hash-property` reads (None: unknown or absent).
RouteFields: TypeAlias = tuple[Mapping[str, object] | None, Mapping[str, object] | None]

DELAYED_FILE = "delayed"


class VHostPublish:
    """Mixed into `VHost`; the attributes below are the vhost's."""

    name: str
    directory: str
    exchanges: dict[str, Exchange]
    queues: dict[str, Queue]
    log: SegmentLog
    delayed: DelayedStore
    queue_dedupers: dict[str, Deduper]
    # The gateway's timer: called with a deadline nearer than any before it.
    on_delay: Callable[[int], None]
    # The gateway's decoder of (headers, properties) from raw properties, for a route
    # that reaches an exchange reading them (the broker core does not parse AMQP).
    decode_for_route: Callable[[bytes], RouteFields]

    def _open_publish_extras(self) -> None:
        """Load delayed messages (dropping those whose exchange is gone) and build the
        queues' deduplication caches (empty: they live in memory only). Start-up only:
        may rewrite and fsync the delayed file."""
        self.on_delay = _no_timer
        self.decode_for_route = _no_fields
        self.delayed = DelayedStore.open(os.path.join(self.directory, DELAYED_FILE))
        orphans = {
            m.exchange
            for m in self.delayed.messages()
            if not _keeps_delayed(self.exchanges.get(m.exchange))
        }
        for exchange in orphans:
            self.delayed.drop_exchange(exchange)
        if len(self.delayed):
            logger.info("vhost %s: restored %d delayed messages", self.name, len(self.delayed))
        self.queue_dedupers = {}
        for queue in self.queues.values():
            try:
                deduper = deduper_for(queue.arguments)
            except BrokerError:
                continue
            if deduper is not None:
                self.queue_dedupers[queue.name] = deduper
        self.log.add_sync_companion(self.delayed.prepare_sync)

    def delay(
        self,
        exchange: Exchange,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        deadline_ms: int,
        persistent: bool,
    ) -> None:
        """Hold a message of a delayed exchange until `deadline_ms`. Kept across a
        restart when the exchange is durable and the message persistent: buffered,
        durable after the next sync round."""
        keep = persistent and exchange.durable
        if self.delayed.add(exchange.name, routing_key, properties_raw, body, deadline_ms, keep):
            self.on_delay(deadline_ms)

    def due_delayed(self, now_ms: int) -> list[DelayedMessage]:
        """The delayed messages whose time has come, for the gateway to route."""
        if not len(self.delayed):
            return []
        return self.delayed.due(now_ms)

    def duplicate_free(
        self, queues: list[Queue], headers: Mapping[str, object] | None, now_ms: int
    ) -> list[Queue]:
        """The queues for which the message is no duplicate (their caches remember it)."""
        dedupers = self.queue_dedupers
        return [
            q
            for q in queues
            if (d := dedupers.get(q.name)) is None or not d.duplicate(headers, now_ms)
        ]

    def _queue_dedup(self, queue: Queue, deduper: Deduper | None) -> None:
        if deduper is not None:
            self.queue_dedupers[queue.name] = deduper
        else:
            self.queue_dedupers.pop(queue.name, None)


def _keeps_delayed(exchange: Exchange | None) -> bool:
    # Not `exchange.delayed`: policies (LavinMQ's `delayed-message`) are applied later,
    # and a message held before its policy went away is still released.
    return exchange is not None and exchange.durable


def _no_timer(deadline_ms: int) -> None:
    pass


def _no_fields(properties_raw: bytes) -> RouteFields:
    return None, None
