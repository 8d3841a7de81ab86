"""Queue federation: a federated queue takes messages from its upstream queue while its
own consumers want more than it holds.

Owns one queue link's session, as RabbitMQ's federated queues behave: the link consumes
the upstream queue (with consumer priority -1, so that the upstream's own consumers come
first) only while the local queue has consumers with credit and nothing ready to give
them, and cancels that consumer once the local queue has no consumer, or holds messages
none of its consumers can take. So consumers on both sides share one workload and
messages move to where the consumers are. Moved messages keep their properties, gain an
`x-received-from` hop, and go to the local queue through the default exchange; queues
apply no hop limit (messages may move back and forth, as in RabbitMQ).

The local queue's demand is read on its changes (`VHost.queue_listeners`: after a drain
round, on a consumer added or gone) and every `DEMAND_POLL_S`, since an ack that gives a
consumer credit back on an empty queue changes nothing the broker announces.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from amqp_gateway import codec
from streamq.broker.queue import Queue
from streamq.links.amqp.client import (
    AmqpConnectionError,
    Channel,
    ChannelClosedError,
    Connection,
    Delivery,
)
from streamq.links.federation.headers import as_table
from streamq.links.federation.link import FederationLink

DEMAND_POLL_S: Final = 0.1
NOT_FOUND: Final = 404
UPSTREAM_CONSUMER_PRIORITY: Final = -1  # the upstream's own consumers first


def has_demand(queue: Queue) -> bool:
    """Consumers with credit and nothing ready for them: fetch from the upstream."""
    return (
        queue.stream is None
        and queue.message_count == 0
        and any(c.credit() > 0 for c in queue.consumers)
    )


def has_enough(queue: Queue) -> bool:
    """No consumer, or ready messages that no consumer can take now: stop fetching."""
    if not queue.consumers:
        return True
    return queue.message_count > 0 and not any(c.credit() > 0 for c in queue.consumers)


class QueueLink(FederationLink):
    """A link from one upstream queue to one federated queue."""

    async def _session(self) -> None:
        upstream, downstream = await self.connect()
        vhost = self.env.broker.vhosts.get(self.spec.vhost)
        try:
            queue = vhost.queues.get(self.spec.resource) if vhost is not None else None
            if vhost is None or queue is None:
                raise AmqpConnectionError(f"queue '{self.spec.resource}' is gone")
            up = await upstream.channel()
            down = await downstream.channel()
            await self._ensure_upstream_queue(upstream, up, queue)
            mode = self.spec.upstream.ack_mode
            if mode == "on-confirm":
                await down.confirm_select()
                self.settle_setup(down, up)
            if mode != "no-ack":
                await up.qos(self.spec.upstream.prefetch_count)
            self._changed = asyncio.Event()
            listeners = vhost.queue_listeners.setdefault(self.spec.resource, [])
            listeners.append(self._queue_changed)
            worker = asyncio.ensure_future(self._follow_demand(up, down))
            try:
                await self.serve(upstream, downstream, [up.closed, down.closed, worker])
            finally:
                worker.cancel()
                listeners.remove(self._queue_changed)
                if not listeners:
                    vhost.queue_listeners.pop(self.spec.resource, None)
        finally:
            await upstream.close()
            await downstream.close()

    async def _ensure_upstream_queue(
        self, connection: Connection, ch: Channel, queue: Queue
    ) -> None:
        """The upstream queue, declared like the local one if it does not exist (the
        passive declare runs on a channel of its own: a 404 closes it)."""
        probe = await connection.channel()
        try:
            await probe.declare_queue(self.spec.upstream_resource, passive=True)
        except ChannelClosedError as exc:
            if exc.reply_code != NOT_FOUND:
                raise
            await ch.declare_queue(
                self.spec.upstream_resource, durable=True, arguments=as_table(queue.arguments)
            )
            return
        await probe.close()

    def _queue_changed(self, queue: Queue) -> None:
        self._changed.set()

    async def _follow_demand(self, up: Channel, down: Channel) -> None:
        """Consume the upstream queue while the local one has demand, not otherwise."""
        tag: str | None = None
        mode = self.spec.upstream.ack_mode
        target = ("", self.spec.resource)

        def on_deliveries(deliveries: list[Delivery]) -> None:
            self.forward(deliveries, up, down, target, None)

        while True:
            vhost = self.env.broker.vhosts.get(self.spec.vhost)
            queue = vhost.queues.get(self.spec.resource) if vhost is not None else None
            if queue is None:
                raise AmqpConnectionError(f"queue '{self.spec.resource}' is gone")
            if tag is None and has_demand(queue):
                arguments: codec.FieldTable = {"x-priority": UPSTREAM_CONSUMER_PRIORITY}
                tag = await up.consume(
                    self.spec.upstream_resource,
                    on_deliveries,
                    no_ack=mode == "no-ack",
                    arguments=arguments,
                )
            elif tag is not None and has_enough(queue):
                await up.cancel(tag)
                tag = None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), DEMAND_POLL_S)
