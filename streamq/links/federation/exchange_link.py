"""Exchange federation: a federated exchange receives what is published to its upstream
exchange with the keys bound downstream.

Owns one exchange link's session, as RabbitMQ's rabbit_federation_exchange_link runs it:
on the upstream, the upstream exchange (declared like the downstream one if it is
missing), a durable queue `federation: X -> node` (with `x-expires`/`x-message-ttl` from
the upstream's `expires`/`message-ttl`), and an internal fanout exchange bound to that
queue, to which every binding key of the downstream exchange is bound from the upstream
exchange (with `x-bound-from`, so that bindings travel no further than messages may). It
follows the downstream exchange's bindings as they come and go (`VHost.binding_listeners`),
consumes the queue and republishes into the downstream exchange with `x-received-from`.

The internal exchange is a fanout (what RabbitMQ falls back to when the upstream lacks
the federation plugin's `x-federation-upstream` type), so the downstream applies
`max-hops` to every message; the upstream needs no plugin.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from streamq.broker.exchange import Binding
from streamq.links.amqp.client import (
    AmqpConnectionError,
    Channel,
    ChannelClosedError,
    Connection,
    Delivery,
)
from streamq.links.federation.headers import (
    INTERNAL_PURPOSE,
    as_table,
    bound_arguments,
    internal_exchange_name,
    thaw_arguments,
    upstream_queue_name,
)
from streamq.links.federation.link import FederationLink

logger = logging.getLogger(__name__)

NOT_FOUND: Final = 404
SUFFIXES: Final = ("A", "B")
# Binding changes waiting for the command channel; past this the session restarts (and
# binds the exchange's bindings as they are then).
BINDING_CHANGES_PENDING_MAX: Final = 10_000

BindingKey = tuple[str, tuple[tuple[str, object], ...]]  # routing key, frozen arguments


class ExchangeLink(FederationLink):
    """A link from one upstream to one federated exchange."""

    _suffix = SUFFIXES[1]  # the internal exchange's suffix of the last session
    _queue = ""

    # -- the session -----------------------------------------------------------------------

    async def _session(self) -> None:
        upstream, downstream = await self.connect()
        vhost = self.env.broker.vhosts.get(self.spec.vhost)
        try:
            if vhost is None or self.spec.resource not in vhost.exchanges:
                raise AmqpConnectionError(f"exchange '{self.spec.resource}' is gone")
            up = await upstream.channel()
            command = await upstream.channel()
            down = await downstream.channel()
            old_internal = await self._declare_upstream(upstream, up)
            # From here on every binding change is queued in order, the exchange's
            # bindings as they are now first (nothing awaits in between).
            self._bindings: dict[BindingKey, int] = {}
            self._changes: asyncio.Queue[tuple[Binding, bool] | None] = asyncio.Queue()
            for binding in vhost.exchanges[self.spec.resource].bindings:
                self._binding_changed(self.spec.resource, binding, True)
            self._changes.put_nowait(None)  # then the old internal exchange goes
            vhost.binding_listeners.append(self._binding_changed)
            worker = asyncio.ensure_future(self._bind_worker(command, old_internal))
            try:
                await self._consume(up, down)
                await self.serve(
                    upstream, downstream, [up.closed, command.closed, down.closed, worker]
                )
            finally:
                worker.cancel()
                vhost.binding_listeners.remove(self._binding_changed)
        finally:
            await upstream.close()
            await downstream.close()

    async def _declare_upstream(self, upstream: Connection, ch: Channel) -> str:
        """The upstream exchange, the link's queue and a fresh internal exchange bound to
        it; returns the previous session's internal exchange, which is deleted once the
        new one has the bindings."""
        spec, up = self.spec, self.spec.upstream
        vhost = self.env.broker.vhosts[spec.vhost]
        exchange = vhost.exchanges[spec.resource]
        await _ensure_exchange(
            upstream, ch, spec.upstream_resource, exchange.type, exchange.arguments
        )
        self._queue = upstream_queue_name(
            spec.upstream_resource, self.current_uri.vhost, spec.resource, spec.vhost, self.env.node
        )
        arguments: codec.FieldTable = dict(INTERNAL_PURPOSE)
        if up.expires_ms is not None:
            arguments["x-expires"] = up.expires_ms
        if up.message_ttl_ms is not None:
            arguments["x-message-ttl"] = up.message_ttl_ms
        await ch.declare_queue(self._queue, durable=True, arguments=arguments)
        old = self._suffix
        self._suffix = SUFFIXES[0] if old == SUFFIXES[1] else SUFFIXES[1]
        internal = internal_exchange_name(self._queue, self._suffix)
        await delete_exchange(ch, internal)
        await ch.declare_exchange(
            internal,
            "fanout",
            durable=True,
            auto_delete=True,
            internal=True,
            arguments=dict(INTERNAL_PURPOSE),
        )
        await ch.bind_queue(self._queue, internal, "")
        return internal_exchange_name(self._queue, old)

    async def _consume(self, up: Channel, down: Channel) -> None:
        mode = self.spec.upstream.ack_mode
        if mode == "on-confirm":
            await down.confirm_select()
            self.settle_setup(down, up)
        if mode != "no-ack":
            await up.qos(self.spec.upstream.prefetch_count)

        def on_deliveries(deliveries: list[Delivery]) -> None:
            self.forward(deliveries, up, down, None, self.spec.upstream.max_hops)

        await up.consume(self._queue, on_deliveries, no_ack=mode == "no-ack")

    # -- bindings ----------------------------------------------------------------------------

    def _binding_changed(self, source: str, binding: Binding, added: bool) -> None:
        """A binding of the vhost changed (VHost.binding_listeners): the federated
        exchange's first binding with a key binds it upstream, the last to go unbinds it
        (several queues may share a key); the calls go out in order."""
        if source != self.spec.resource:
            return
        key: BindingKey = (binding.routing_key, binding.arguments)
        count = self._bindings.get(key, 0)
        if added:
            self._bindings[key] = count + 1
        elif count <= 1:
            self._bindings.pop(key, None)
        else:
            self._bindings[key] = count - 1
        if (added and count != 0) or (not added and count != 1):
            return
        if self._changes.qsize() >= BINDING_CHANGES_PENDING_MAX:
            self.restart()  # the next session binds what there is then
            return
        self._changes.put_nowait((binding, added))

    async def _bind_worker(self, command: Channel, old_internal: str) -> None:
        while True:
            change = await self._changes.get()
            if change is None:
                await delete_exchange(command, old_internal)
                continue
            binding, added = change
            arguments = bound_arguments(
                thaw_arguments(binding.arguments),
                self.spec.upstream.max_hops,
                self.spec.vhost,
                self.spec.resource,
                self._suffix,
                self.env.node,
            )
            if arguments is None:
                continue  # it has gone as far as messages may come
            internal = internal_exchange_name(self._queue, self._suffix)
            source = self.spec.upstream_resource
            if added:
                await command.bind_exchange(internal, source, binding.routing_key, arguments)
            else:
                await command.unbind_exchange(internal, source, binding.routing_key, arguments)

    # -- removal -----------------------------------------------------------------------------

    async def _cleanup_upstream(self) -> None:
        """Delete the link's queue and internal exchanges upstream (RabbitMQ does on a
        normal stop: the policy or the upstream was removed)."""
        if not self._queue:
            return
        connection = await Connection.connect(
            self.upstream_uri(), name=f"Federation link cleanup {self.name}"
        )
        try:
            ch = await connection.channel()
            await ch.delete_queue(self._queue)
            for suffix in SUFFIXES:
                await delete_exchange(ch, internal_exchange_name(self._queue, suffix))
        finally:
            await connection.close()


async def _ensure_exchange(
    connection: Connection, ch: Channel, name: str, kind: str, arguments: Mapping[str, object]
) -> None:
    """Declare the upstream exchange like the downstream one if it does not exist (a
    passive declare first, on a channel of its own: a 404 closes that channel)."""
    probe = await connection.channel()
    try:
        await probe.declare_exchange(name, kind, passive=True)
    except ChannelClosedError as exc:
        if exc.reply_code != NOT_FOUND:
            raise
        await ch.declare_exchange(name, kind, durable=True, arguments=as_table(arguments))
        return
    await probe.close()


async def delete_exchange(ch: Channel, name: str) -> None:
    """exchange.delete (deleting a missing exchange succeeds, in RabbitMQ as here)."""
    await ch.call(m.ExchangeDelete(exchange=name), m.ExchangeDeleteOk)
