"""The AMQP server: the only code that touches sockets (STYLE.md section 2).

Owns one asyncio protocol object per connection. It feeds socket bytes to the sans-IO
`Connection`, turns its events into broker-core calls, writes the outgoing buffer once per
read and once per delivery batch, runs heartbeats, and waits for the log's group commit
before it confirms publishes. There is no task per message: one confirm task per
connection at most, and one drain callback per event-loop turn for all deliveries.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
import time
from collections.abc import Callable
from typing import Final, cast

from amqp_gateway import codec, errors
from amqp_gateway.channels import ChannelSession, GatewayConsumer, Unacked
from amqp_gateway.codec import methods as m
from amqp_gateway.connection import (
    SERVER_CAPABILITIES,
    ChannelClosed,
    Connection,
    ConnectionClosed,
    Event,
    LoginRequested,
    MethodReceived,
    OpenRequested,
    Publish,
    State,
)
from amqp_gateway.errormap import to_amqp
from streamq import __version__
from streamq.broker.accounts import PermissionKind
from streamq.broker.broker import Broker
from streamq.broker.errors import BrokerError
from streamq.broker.exchange import Destination
from streamq.broker.users import login_allowed
from streamq.broker.vhost import VHost
from streamq.log.errors import LogError

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S: Final = 10.0  # wait this long for close-ok before dropping the socket
WRITE_BUFFER_HIGH_BYTES: Final = 4 * 1024 * 1024  # deliveries pause above this
SEGMENT_COLLECT_INTERVAL_S: Final = 5.0
# Acks and deliveries are recorded in queue journals; this often at the latest they are
# written and fsynced even when no publisher asks for a sync round.
JOURNAL_FLUSH_INTERVAL_S: Final = 0.2
HANDSHAKE_TIMEOUT_S: Final = 10.0  # RabbitMQ's handshake_timeout: open within this
HEARTBEAT_CHECK_FIRST_S: Final = 0.5  # the first check follows the handshake closely
HEARTBEAT_IDLE_CHECK_S: Final = 5.0
PERMIT_CACHE_ENTRIES_MAX: Final = 1024  # heartbeats off: look again later (they may be tuned)


class Gateway:
    """The AMQP side of a broker: connection handlers and the delivery drain."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.handlers: set[AmqpHandler] = set()
        self._to_flush: set[AmqpHandler] = set()
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._housekeeping_task: asyncio.Task[None] | None = None
        self._held_readers: list[AmqpHandler] = []

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for vhost in self.broker.vhosts.values():
            vhost.wakeup = self.schedule_drain
        self._housekeeping_task = loop.create_task(self._housekeeping())

    async def _housekeeping(self) -> None:
        """Flush queue journals that no sync round has covered lately, and drop log
        segments no queue needs (after a round, so that the acks that freed them are
        durable before the segments go)."""
        since_collect_s = 0.0
        while True:
            await asyncio.sleep(JOURNAL_FLUSH_INTERVAL_S)
            since_collect_s += JOURNAL_FLUSH_INTERVAL_S
            collect = since_collect_s >= SEGMENT_COLLECT_INTERVAL_S
            if collect:
                since_collect_s = 0.0
            for vhost in list(self.broker.vhosts.values()):
                try:
                    if vhost.needs_sync() or collect:
                        await vhost.sync_all()
                    if collect:
                        vhost.collect_segments()
                except LogError as exc:
                    logger.error("vhost %s: housekeeping failed: %s", vhost.name, exc)

    def stop(self) -> None:
        if self._housekeeping_task is not None:
            self._housekeeping_task.cancel()

    def schedule_drain(self) -> None:
        if not self._drain_scheduled and self._loop is not None:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        for vhost in self.broker.vhosts.values():
            if vhost.dirty:
                vhost.drain()
        self.flush_all()
        held, self._held_readers = self._held_readers, []
        for handler in held:
            handler.resume_after_drain()

    def hold_reading(self, handler: AmqpHandler) -> None:
        """Stop reading from `handler` until the pending drain has run.

        The event loop may call `data_received` back to back for as long as a fast
        publisher keeps its socket readable; deliveries wait for the loop's next turn. A
        publisher that read a batch while deliveries are pending therefore waits for one
        drain: publishing and delivering alternate batch by batch.
        """
        self._held_readers.append(handler)

    @property
    def drain_pending(self) -> bool:
        return self._drain_scheduled

    def want_flush(self, handler: AmqpHandler) -> None:
        self._to_flush.add(handler)
        self.schedule_drain()

    def flush_all(self) -> None:
        handlers = self._to_flush
        self._to_flush = set()
        for handler in handlers:
            handler.flush()

    def close_all(self, reason: str) -> None:
        """Close every connection with 320 CONNECTION_FORCED (graceful shutdown)."""
        for handler in list(self.handlers):
            handler.force_close(reason)

    def protocol_factory(self) -> AmqpHandler:
        return AmqpHandler(self)


def server_properties() -> codec.FieldTable:
    return {
        "product": "streamq",
        "version": __version__,
        "platform": "Python",
        "information": "A streaming-first AMQP 0-9-1 broker",
        "capabilities": dict(SERVER_CAPABILITIES),
    }


class AmqpHandler(asyncio.Protocol):
    """One client connection."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.broker = gateway.broker
        self.conn = Connection(server_properties(), time.monotonic())
        self.channels: dict[int, ChannelSession] = {}
        self.vhost: VHost | None = None
        self.paused = False
        self.peer = "?"
        self._peer_is_loopback = False
        self._transport: asyncio.Transport | None = None
        self._heartbeat: asyncio.TimerHandle | None = None
        self._confirming = False
        self._closing_timer: asyncio.TimerHandle | None = None
        self._connected_s = time.monotonic()
        # A reply that must wait for a sync round (Declare-Ok of a durable entity,
        # Commit-Ok); while one waits, reading stops and later events are held, so that
        # replies keep their order.
        self._waiting: tuple[int, m.Method] | None = None
        self._held: list[Event] = []
        self._published = False  # since reading was last held for a drain
        self._reading_held = False
        self.user = ""
        # Permissions change only while the broker is stopped (streamq ctl), so each
        # connection caches its answers.
        self._permits: dict[tuple[str, str, str], bool] = {}
        self._handlers: dict[type[m.Method], Callable[[ChannelSession, m.Method], None]] = {
            m.ExchangeDeclare: self._exchange_declare,
            m.ExchangeDelete: self._exchange_delete,
            m.ExchangeBind: self._exchange_bind,
            m.ExchangeUnbind: self._exchange_unbind,
            m.QueueDeclare: self._queue_declare,
            m.QueueBind: self._queue_bind,
            m.QueueUnbind: self._queue_unbind,
            m.QueuePurge: self._queue_purge,
            m.QueueDelete: self._queue_delete,
            m.BasicQos: self._basic_qos,
            m.BasicConsume: self._basic_consume,
            m.BasicCancel: self._basic_cancel,
            m.BasicGet: self._basic_get,
            m.BasicAck: self._basic_ack,
            m.BasicNack: self._basic_nack,
            m.BasicReject: self._basic_reject,
            m.BasicRecover: self._basic_recover,
            m.BasicRecoverAsync: self._basic_recover,
            m.ChannelFlow: self._channel_flow,
            m.ConfirmSelect: self._confirm_select,
            m.TxSelect: self._tx_select,
            m.TxCommit: self._tx_commit,
            m.TxRollback: self._tx_rollback,
            m.AccessRequest: self._access_request,
        }

    # -- socket events ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) else ""
        self.peer = f"{host}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        try:
            self._peer_is_loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            self._peer_is_loopback = False
        self.gateway.handlers.add(self)
        self._schedule_heartbeat(HEARTBEAT_CHECK_FIRST_S)

    def data_received(self, data: bytes) -> None:
        events = self.conn.receive_data(data, time.monotonic())
        if self._waiting is not None:
            self._held.extend(events)
            return
        self._handle_events(events)
        self.flush()
        transport = self._transport
        if (
            self._published
            and self.gateway.drain_pending
            and self._waiting is None
            and transport is not None
            and not transport.is_closing()
        ):
            self._published = False
            self._reading_held = True
            transport.pause_reading()
            self.gateway.hold_reading(self)

    def resume_after_drain(self) -> None:
        transport = self._transport
        self._reading_held = False
        if self._waiting is None and transport is not None and not transport.is_closing():
            transport.resume_reading()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.vhost is not None:
            for channel in self.channels.values():
                for consumer in channel.consumers.values():
                    self.vhost.kick(consumer.queue)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cleanup()

    def note_output(self) -> None:
        self.gateway.want_flush(self)

    def force_close(self, reason: str) -> None:
        events: list[Event] = []
        self.conn.close(320, f"CONNECTION_FORCED - {reason}", 0, 0, events)
        self._handle_events(events)
        self.flush()
        if self._transport is not None:
            self._transport.close()

    def flush(self) -> None:
        transport = self._transport
        if transport is None:
            return
        data = self.conn.take_outgoing(time.monotonic())
        if data:
            transport.write(data)
        if self.conn.state is State.CLOSED:
            transport.close()

    # -- events ----------------------------------------------------------------------------

    def _handle_events(self, events: list[Event]) -> None:
        confirm_needed = False
        for index, event in enumerate(events):
            if self._waiting is not None:
                self._held.extend(events[index:])
                break
            try:
                if type(event) is Publish:
                    self._published = True
                    confirm_needed |= self._publish(event)
                elif isinstance(event, MethodReceived):
                    self._method(event.channel, event.method)
                elif isinstance(event, ChannelClosed):
                    self._channel_closed(event.channel)
                elif isinstance(event, LoginRequested):
                    self._login(event)
                elif isinstance(event, OpenRequested):
                    self._open(event.virtual_host)
                elif isinstance(event, ConnectionClosed):
                    self._cleanup()
            except errors.AMQPError as exc:
                self._fail(exc, getattr(event, "channel", 0))
            except (BrokerError, LogError) as exc:
                self._fail(to_amqp(exc, 0, 0), getattr(event, "channel", 0))
            except Exception as exc:  # a bug in a handler: 541 for this connection only
                logger.exception("internal error on connection %s", self.peer)
                self._fail(errors.InternalError(f"internal error: {exc}"), 0)
        if confirm_needed and not self._confirming:
            self._confirming = True
            asyncio.get_running_loop().create_task(self._confirm_loop())

    def _reply_durable(self, channel_id: int, method: m.Method, *, always: bool) -> None:
        """Send `method` once every change so far is durable: at once if nothing is
        pending (and not `always`), else after a sync round, holding later events."""
        vhost = self._vhost()
        if not always and not vhost.needs_sync():
            self.conn.send_method(channel_id, method)
            return
        self._waiting = (channel_id, method)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
        asyncio.get_running_loop().create_task(self._reply_after_sync(vhost))

    async def _reply_after_sync(self, vhost: VHost) -> None:
        assert self._waiting is not None
        channel_id, method = self._waiting
        try:
            await vhost.sync_all()
        except LogError as exc:
            logger.error("message store failed; closing connection %s: %s", self.peer, exc)
            self._waiting = None
            self._fail(to_amqp(exc, method.CLASS_ID, method.METHOD_ID), 0)
        else:
            self._waiting = None
            if self.conn.is_channel_open(channel_id):
                self.conn.send_method(channel_id, method)
        held, self._held = self._held, []
        if self.conn.state is not State.CLOSED:
            self._handle_events(held)
        self.flush()
        transport = self._transport
        if (
            self._waiting is None
            and not self._reading_held
            and transport is not None
            and not transport.is_closing()
        ):
            transport.resume_reading()

    def _fail(self, exc: errors.AMQPError, channel: int) -> None:
        events: list[Event] = []
        self.conn.fail(exc, channel, events)
        if self.conn.state is State.CLOSING and self._closing_timer is None:
            loop = asyncio.get_running_loop()
            self._closing_timer = loop.call_later(CLOSE_TIMEOUT_S, self._abort)
        self._handle_events(events)

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _login(self, event: LoginRequested) -> None:
        user = self.broker.accounts.authenticate(event.username, event.password)
        if user is None or not login_allowed(user.name, self._peer_is_loopback):
            logger.warning("login refused for user %r from %s", event.username, self.peer)
            raise errors.AccessRefused(
                f"Login was refused using authentication mechanism {event.mechanism}. "
                "For details see the broker logfile.",
                10,
                11,
            )
        self.conn.accept_login(user.name)
        self.user = user.name

    def _open(self, virtual_host: str) -> None:
        try:
            vhost = self.broker.vhost(virtual_host)
        except BrokerError as exc:
            raise to_amqp(exc, 10, 40) from exc
        if not self.broker.accounts.vhost_access(self.user, virtual_host):
            raise errors.NotAllowed(
                f"access to vhost '{virtual_host}' refused for user '{self.user}'", 10, 40
            )
        self.vhost = vhost
        self.conn.accept_open(virtual_host)

    def _check_access(
        self, kind: PermissionKind, resource: str, name: str, ids: tuple[int, int]
    ) -> None:
        """RabbitMQ's resource permissions: 403 unless the user's `kind` regex allows it."""
        key = (kind, resource, name)
        allowed = self._permits.get(key)
        if allowed is None:
            vhost = self._vhost().name
            allowed = self.broker.accounts.permitted(self.user, vhost, kind, name)
            if len(self._permits) >= PERMIT_CACHE_ENTRIES_MAX:
                self._permits.clear()
            self._permits[key] = allowed
        if not allowed:
            shown = name or "amq.default"
            raise errors.AccessRefused(
                f"access to {resource} '{shown}' in vhost '{self._vhost().name}' "
                f"refused for user '{self.user}'",
                *ids,
            )

    def _method(self, channel_id: int, method: m.Method) -> None:
        channel = self.channels.get(channel_id)
        if channel is None:
            if isinstance(method, m.ChannelOpen):
                return
            channel = self.channels[channel_id] = ChannelSession(channel_id, self.conn, self)
        handler = self._handlers.get(type(method))
        if handler is None:
            raise errors.CommandInvalid(
                f"unexpected method {method.NAME}", method.CLASS_ID, method.METHOD_ID
            )
        try:
            handler(channel, method)
        except (BrokerError, LogError) as exc:
            raise to_amqp(exc, method.CLASS_ID, method.METHOD_ID) from exc

    def _channel(self, channel_id: int) -> ChannelSession:
        channel = self.channels.get(channel_id)
        if channel is None:
            channel = self.channels[channel_id] = ChannelSession(channel_id, self.conn, self)
        return channel

    def _channel_closed(self, channel_id: int) -> None:
        channel = self.channels.pop(channel_id, None)
        if channel is not None:
            self._release_channel(channel)

    def _release_channel(self, channel: ChannelSession) -> None:
        vhost = self.vhost
        if vhost is None:
            return
        for consumer in list(channel.consumers.values()):
            vhost.remove_consumer(consumer.queue, consumer)
        channel.consumers.clear()
        # Unacked deliveries go back to their queues in their original order.
        for entry in channel.unacked.values():
            vhost.requeue(entry.queue, entry.offset)
        channel.unacked.clear()

    def _cleanup(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if self._closing_timer is not None:
            self._closing_timer.cancel()
            self._closing_timer = None
        for channel in list(self.channels.values()):
            self._release_channel(channel)
        self.channels.clear()
        if self.vhost is not None:
            for queue in list(self.vhost.queues.values()):
                if queue.exclusive_owner is self:
                    self.vhost.remove_queue(queue)
        self.gateway.handlers.discard(self)
        self.flush()

    # -- heartbeats ------------------------------------------------------------------------

    def _schedule_heartbeat(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._heartbeat = loop.call_later(delay_s, self._on_heartbeat)

    def _on_heartbeat(self) -> None:
        now = time.monotonic()
        if self.conn.state < State.OPEN and now - self._connected_s > HANDSHAKE_TIMEOUT_S:
            logger.warning("handshake timeout from client %s, closing", self.peer)
            self._abort()
            return
        if not self.conn.check_heartbeat(now):
            logger.warning("missed heartbeats from client %s, closing", self.peer)
            self._abort()
            return
        self.flush()
        heartbeat_s = self.conn.heartbeat_s
        if self.conn.state < State.OPEN:
            self._schedule_heartbeat(HEARTBEAT_CHECK_FIRST_S)
        else:
            self._schedule_heartbeat(heartbeat_s / 2 if heartbeat_s > 0 else HEARTBEAT_IDLE_CHECK_S)

    # -- publish and confirms --------------------------------------------------------------

    def _publish(self, publish: Publish) -> bool:
        """Route and store one message; True if a confirm is now owed."""
        channel = self._channel(publish.channel)
        vhost = self.vhost
        assert vhost is not None
        if publish.immediate:
            raise errors.AMQPNotImplemented("immediate=true", 60, 40)
        self._check_access("write", "exchange", publish.exchange, (60, 40))
        if channel.transactional:
            channel.tx_publishes.append(publish)
            return False
        if channel.confirm:
            channel.publish_seq += 1
        self._route_and_store(vhost, channel, publish)
        return channel.confirm

    def _route_and_store(self, vhost: VHost, channel: ChannelSession, publish: Publish) -> None:
        headers = None
        exchange = vhost.exchanges.get(publish.exchange)
        if exchange is None:
            raise errors.NotFound(
                f"no exchange '{publish.exchange}' in vhost '{vhost.name}'", 60, 40
            )
        if exchange.internal:
            raise errors.AccessRefused(
                f"cannot publish to internal exchange '{publish.exchange}' in vhost '{vhost.name}'",
                60,
                40,
            )
        if exchange.type == "headers":
            headers = codec.decode_properties(publish.properties_raw).headers
        queues = vhost.route(publish.exchange, publish.routing_key, headers)
        offset = vhost.publish(
            publish.exchange, publish.routing_key, publish.properties_raw, publish.body, queues
        )
        if offset is None and publish.mandatory:
            self.conn.send_content(
                channel.id,
                m.BasicReturn(
                    reply_code=312,
                    reply_text="NO_ROUTE",
                    exchange=publish.exchange,
                    routing_key=publish.routing_key,
                ),
                publish.properties_raw,
                publish.body,
            )

    async def _confirm_loop(self) -> None:
        """Confirm publishes once the log has made them durable: one sync round covers
        every publish so far on every channel, and each channel gets one cumulative ack."""
        try:
            while self.vhost is not None and self.conn.state is State.OPEN:
                owed = {
                    channel: channel.publish_seq
                    for channel in self.channels.values()
                    if channel.confirm and channel.publish_seq > channel.confirmed_seq
                }
                if not owed:
                    return
                await self.vhost.sync()
                for channel, seq in owed.items():
                    if self.channels.get(channel.id) is channel and seq > channel.confirmed_seq:
                        codec.append_basic_ack(
                            self.conn.outgoing,
                            codec.ChannelId(channel.id),
                            codec.DeliveryTag(seq),
                            True,
                        )
                        channel.confirmed_seq = seq
                self.flush()
        except LogError as exc:
            logger.error("message store failed; closing connection %s: %s", self.peer, exc)
            self._fail(to_amqp(exc, 60, 40), 0)
            self.flush()
        finally:
            self._confirming = False

    # -- exchange and queue methods --------------------------------------------------------

    def _vhost(self) -> VHost:
        assert self.vhost is not None
        return self.vhost

    def _exchange_declare(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.ExchangeDeclare)
        if not method.passive:
            self._check_access("configure", "exchange", method.exchange, (40, 10))
        self._vhost().declare_exchange(
            method.exchange,
            method.type,
            method.passive,
            method.durable,
            method.auto_delete,
            method.internal,
            method.arguments,
        )
        if not method.nowait:
            self._reply_durable(channel.id, m.ExchangeDeclareOk(), always=False)

    def _exchange_delete(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.ExchangeDelete)
        self._check_access("configure", "exchange", method.exchange, (40, 20))
        self._vhost().delete_exchange(method.exchange, method.if_unused)
        if not method.nowait:
            self._reply_durable(channel.id, m.ExchangeDeleteOk(), always=False)

    def _exchange_bind(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.ExchangeBind)
        self._check_access("write", "exchange", method.destination, (40, 30))
        self._check_access("read", "exchange", method.source, (40, 30))
        self._vhost().bind(
            Destination("exchange", method.destination),
            method.source,
            method.routing_key,
            method.arguments,
        )
        if not method.nowait:
            self._reply_durable(channel.id, m.ExchangeBindOk(), always=False)

    def _exchange_unbind(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.ExchangeUnbind)
        self._check_access("write", "exchange", method.destination, (40, 40))
        self._check_access("read", "exchange", method.source, (40, 40))
        self._vhost().unbind(
            Destination("exchange", method.destination),
            method.source,
            method.routing_key,
            method.arguments,
        )
        if not method.nowait:
            self._reply_durable(channel.id, m.ExchangeUnbindOk(), always=False)

    def _queue_declare(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.QueueDeclare)
        if not method.passive and method.queue:
            self._check_access("configure", "queue", method.queue, (50, 10))
        queue = self._vhost().declare_queue(
            method.queue,
            method.passive,
            method.durable,
            method.exclusive,
            method.auto_delete,
            method.arguments,
            self,
        )
        channel.last_queue = queue.name
        if not method.nowait:
            self._reply_durable(
                channel.id,
                m.QueueDeclareOk(
                    queue=queue.name,
                    message_count=queue.cursor.message_count,
                    consumer_count=len(queue.consumers),
                ),
                always=False,
            )

    def _queue_bind(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.QueueBind)
        name = _queue_name(channel, method.queue, (50, 20))
        # Spec: an empty queue name and routing key bind with the queue's name as key.
        routing_key = method.routing_key or (name if not method.queue else "")
        self._check_access("write", "queue", name, (50, 20))
        self._check_access("read", "exchange", method.exchange, (50, 20))
        vhost = self._vhost()
        vhost.queue(name, self)
        vhost.bind(Destination("queue", name), method.exchange, routing_key, method.arguments)
        if not method.nowait:
            self._reply_durable(channel.id, m.QueueBindOk(), always=False)

    def _queue_unbind(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.QueueUnbind)
        name = _queue_name(channel, method.queue, (50, 50))
        self._check_access("write", "queue", name, (50, 50))
        self._check_access("read", "exchange", method.exchange, (50, 50))
        vhost = self._vhost()
        if name in vhost.queues:
            vhost.queue(name, self)  # the exclusive lock still applies
        # A missing queue, exchange or binding is not an error (RabbitMQ).
        vhost.unbind(
            Destination("queue", name), method.exchange, method.routing_key, method.arguments
        )
        self._reply_durable(channel.id, m.QueueUnbindOk(), always=False)

    def _queue_purge(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.QueuePurge)
        name = _queue_name(channel, method.queue, (50, 30))
        self._check_access("read", "queue", name, (50, 30))
        count = self._vhost().purge_queue(name, self)
        if not method.nowait:
            self._reply_durable(channel.id, m.QueuePurgeOk(message_count=count), always=False)

    def _queue_delete(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.QueueDelete)
        name = _queue_name(channel, method.queue, (50, 40))
        self._check_access("configure", "queue", name, (50, 40))
        vhost = self._vhost()
        if name not in vhost.queues:
            # RabbitMQ: deleting a queue that does not exist succeeds with a count of 0.
            if not method.nowait:
                self.conn.send_method(channel.id, m.QueueDeleteOk(message_count=0))
            return
        queue = vhost.queue(name, self)
        consumers = [c for c in queue.consumers if isinstance(c, GatewayConsumer)]
        count = vhost.delete_queue(name, method.if_unused, method.if_empty, self)
        for consumer in consumers:
            self._cancel_notify(consumer)
        if not method.nowait:
            self._reply_durable(channel.id, m.QueueDeleteOk(message_count=count), always=False)

    def _cancel_notify(self, consumer: GatewayConsumer) -> None:
        """consumer_cancel_notify: tell a consumer its queue is gone."""
        channel = consumer.channel
        channel.consumers.pop(consumer.tag, None)
        owner = cast(AmqpHandler, channel.owner)
        if owner.conn.is_channel_open(channel.id):
            owner.conn.send_method(
                channel.id, m.BasicCancel(consumer_tag=consumer.tag, nowait=True)
            )
            owner.note_output()

    # -- basic methods ---------------------------------------------------------------------

    def _basic_qos(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.BasicQos)
        if method.prefetch_size != 0:
            raise errors.AMQPNotImplemented(f"prefetch_size!=0 ({method.prefetch_size})", 60, 10)
        if method.global_:
            channel.channel_prefetch = method.prefetch_count
        else:
            # Per-consumer prefetch applies to consumers started after it (RabbitMQ).
            channel.consumer_prefetch = method.prefetch_count
        self.conn.send_method(channel.id, m.BasicQosOk())
        for consumer in channel.consumers.values():
            self._vhost().kick(consumer.queue)

    def _basic_consume(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.BasicConsume)
        name = _queue_name(channel, method.queue, (60, 20))
        self._check_access("read", "queue", name, (60, 20))
        vhost = self._vhost()
        queue = vhost.queue(name, self)
        tag = method.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in channel.consumers:
            raise errors.NotAllowed(f"attempt to reuse consumer tag '{tag}'", 60, 20)
        consumer = GatewayConsumer(
            channel, queue, tag, method.no_ack, method.exclusive, channel.consumer_prefetch
        )
        vhost.add_consumer(queue, consumer)  # raises before consume-ok if refused
        channel.consumers[tag] = consumer
        if not method.nowait:
            self.conn.send_method(channel.id, m.BasicConsumeOk(consumer_tag=tag))

    def _basic_cancel(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.BasicCancel)
        consumer = channel.consumers.pop(method.consumer_tag, None)
        if consumer is not None:
            self._vhost().remove_consumer(consumer.queue, consumer)
        if not method.nowait:
            self.conn.send_method(channel.id, m.BasicCancelOk(consumer_tag=method.consumer_tag))

    def _basic_get(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.BasicGet)
        name = _queue_name(channel, method.queue, (60, 70))
        self._check_access("read", "queue", name, (60, 70))
        vhost = self._vhost()
        queue = vhost.queue(name, self)
        ready = queue.cursor.take()
        if ready is None:
            self.conn.send_method(channel.id, m.BasicGetEmpty())
            return
        stored = vhost.messages[ready.offset]
        tag = channel.take_tag()
        self.conn.send_content(
            channel.id,
            m.BasicGetOk(
                delivery_tag=codec.DeliveryTag(tag),
                redelivered=ready.redelivered,
                exchange=stored.exchange,
                routing_key=stored.routing_key,
                message_count=queue.cursor.message_count,
            ),
            stored.properties_raw,
            stored.body,
        )
        if method.no_ack:
            vhost.settle(queue, ready.offset)
        else:
            channel.unacked[tag] = Unacked(queue, ready.offset, None)

    def _settle(
        self,
        channel: ChannelSession,
        tag: int,
        multiple: bool,
        ack: bool,
        requeue: bool,
        ids: tuple[int, int],
    ) -> None:
        if channel.transactional:
            channel.tx_acks.append((tag, multiple, ack, requeue))
            return
        self._apply_settle(channel, tag, multiple, ack, requeue, ids)

    def _apply_settle(
        self,
        channel: ChannelSession,
        tag: int,
        multiple: bool,
        ack: bool,
        requeue: bool,
        ids: tuple[int, int],
    ) -> None:
        vhost = self._vhost()
        settled = channel.settle_tags(tag, multiple)
        if not settled and not (multiple and tag == 0):
            raise errors.PreconditionFailed(f"unknown delivery tag {tag}", *ids)
        for entry in settled:
            if ack or not requeue:
                vhost.settle(entry.queue, entry.offset)
            else:
                vhost.requeue(entry.queue, entry.offset)
            vhost.kick(entry.queue)

    def _basic_ack(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.BasicAck)
        self._settle(channel, method.delivery_tag, method.multiple, True, False, (60, 80))

    def _basic_nack(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.BasicNack)
        self._settle(
            channel, method.delivery_tag, method.multiple, False, method.requeue, (60, 120)
        )

    def _basic_reject(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.BasicReject)
        self._settle(channel, method.delivery_tag, False, False, method.requeue, (60, 90))

    def _basic_recover(self, channel: ChannelSession, method: m.Method) -> None:
        # requeue=false would mean redelivering to the same consumer: RabbitMQ refuses
        # it with 540 (a connection error); requeue=true requeues every unacked delivery.
        if not getattr(method, "requeue", True):
            raise errors.AMQPNotImplemented("requeue=false", method.CLASS_ID, method.METHOD_ID)
        vhost = self._vhost()
        for entry in channel.settle_tags(0, True):
            vhost.requeue(entry.queue, entry.offset)
        if isinstance(method, m.BasicRecover):
            self.conn.send_method(channel.id, m.BasicRecoverOk())

    def _channel_flow(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.ChannelFlow)
        channel.flow_active = method.active
        self.conn.send_method(channel.id, m.ChannelFlowOk(active=method.active))
        if method.active:
            for consumer in channel.consumers.values():
                self._vhost().kick(consumer.queue)

    def _confirm_select(self, channel: ChannelSession, method: m.Method) -> None:
        assert isinstance(method, m.ConfirmSelect)
        if channel.transactional:
            raise errors.PreconditionFailed("cannot switch from tx to confirm mode", 85, 10)
        channel.confirm = True
        if not method.nowait:
            self.conn.send_method(channel.id, m.ConfirmSelectOk())

    def _tx_select(self, channel: ChannelSession, method: m.Method) -> None:
        if channel.confirm:
            raise errors.PreconditionFailed("cannot switch from confirm to tx mode", 90, 10)
        channel.transactional = True
        self.conn.send_method(channel.id, m.TxSelectOk())

    def _tx_commit(self, channel: ChannelSession, method: m.Method) -> None:
        if not channel.transactional:
            raise errors.PreconditionFailed("channel is not transactional", 90, 20)
        vhost = self._vhost()
        acks, channel.tx_acks = channel.tx_acks, []
        publishes, channel.tx_publishes = channel.tx_publishes, []
        for tag, multiple, ack, requeue in acks:
            self._apply_settle(channel, tag, multiple, ack, requeue, (90, 20))
        for publish in publishes:
            self._route_and_store(vhost, channel, publish)
        # Commit-Ok goes out once the committed publishes and acks are on disk.
        self._reply_durable(channel.id, m.TxCommitOk(), always=True)

    def _tx_rollback(self, channel: ChannelSession, method: m.Method) -> None:
        if not channel.transactional:
            raise errors.PreconditionFailed("channel is not transactional", 90, 30)
        channel.tx_acks.clear()
        channel.tx_publishes.clear()
        self.conn.send_method(channel.id, m.TxRollbackOk())

    def _access_request(self, channel: ChannelSession, method: m.Method) -> None:
        self.conn.send_method(channel.id, m.AccessRequestOk(ticket=1))


def _queue_name(channel: ChannelSession, name: str, ids: tuple[int, int]) -> str:
    """Spec rule: an empty queue name means the queue last declared on the channel."""
    if name:
        return name
    if channel.last_queue is None:
        raise errors.NotFound("no previously declared queue", *ids)
    return channel.last_queue


async def start_amqp_server(gateway: Gateway, host: str, port: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    gateway.attach(loop)
    return await loop.create_server(gateway.protocol_factory, host, port, reuse_address=True)
