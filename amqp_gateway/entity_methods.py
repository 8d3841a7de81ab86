"""The exchange and queue classes of AMQP 0-9-1, server side: one function per method.

Owns the translation of exchange.* and queue.* methods into broker-core calls, with the
permission checks and the replies (Declare-Ok and the like go out after a sync round when
a durable entity changed: `AmqpSession.reply_durable`). Each function takes the connection's
session, the channel and the decoded method; the session's table dispatches to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amqp_gateway import access, errors, reply_to
from amqp_gateway.channels import ChannelSession, GatewayConsumer
from amqp_gateway.codec import methods as m
from streamq.broker.account_limits import MAX_QUEUES
from streamq.broker.exchange import Destination
from streamq.broker.vhost_entities import DEFAULT_EXCHANGE_REFUSED

if TYPE_CHECKING:
    from amqp_gateway.session import AmqpSession


def exchange_declare(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.ExchangeDeclare)
    if method.exchange == "":
        # RabbitMQ 3.10 refuses the default exchange before any other check, passive
        # included (rabbit_channel:check_not_default_exchange), so before permissions:
        # a passive declare of "" must not answer declare-ok as if it were a name.
        raise errors.AccessRefused(DEFAULT_EXCHANGE_REFUSED, 40, 10)
    if not method.passive:
        h.check_access("configure", "exchange", method.exchange, (40, 10))
    vhost = h.current_vhost()
    existed = method.exchange in vhost.exchanges
    vhost.declare_exchange(
        method.exchange,
        method.type,
        method.passive,
        method.durable,
        method.auto_delete,
        method.internal,
        method.arguments,
        h.user,
    )
    if not method.nowait:
        _reply_declare_ok(h, channel.id, m.ExchangeDeclareOk(), created=not existed)


def exchange_delete(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.ExchangeDelete)
    h.check_access("configure", "exchange", method.exchange, (40, 20))
    h.current_vhost().delete_exchange(method.exchange, method.if_unused)
    if not method.nowait:
        h.reply_durable(channel.id, m.ExchangeDeleteOk(), always=False)


def exchange_bind(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.ExchangeBind)
    h.check_access("write", "exchange", method.destination, (40, 30))
    h.check_access("read", "exchange", method.source, (40, 30))
    access.check_topic_access(h, "read", method.source, method.routing_key, (40, 30))
    h.current_vhost().bind(
        Destination("exchange", method.destination),
        method.source,
        method.routing_key,
        method.arguments,
    )
    if not method.nowait:
        h.reply_durable(channel.id, m.ExchangeBindOk(), always=False)


def exchange_unbind(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.ExchangeUnbind)
    h.check_access("write", "exchange", method.destination, (40, 40))
    h.check_access("read", "exchange", method.source, (40, 40))
    access.check_topic_access(h, "read", method.source, method.routing_key, (40, 40))
    h.current_vhost().unbind(
        Destination("exchange", method.destination),
        method.source,
        method.routing_key,
        method.arguments,
    )
    if not method.nowait:
        h.reply_durable(channel.id, m.ExchangeUnbindOk(), always=False)


def queue_declare(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.QueueDeclare)
    if method.passive and method.queue.startswith(reply_to.REPLY_TO_QUEUE):
        _declare_reply_to(h, channel, method)
        return
    if not method.passive and method.queue:
        h.check_access("configure", "queue", method.queue, (50, 10))
    vhost = h.current_vhost()
    existed = method.passive or method.queue in vhost.queues
    queue = vhost.declare_queue(
        method.queue,
        method.passive,
        method.durable,
        method.exclusive,
        method.auto_delete,
        method.arguments,
        h,
        queue_max=h.broker.accounts.vhost_limit(vhost.name, MAX_QUEUES),
    )
    channel.last_queue = queue.name
    if not method.nowait:
        reply = m.QueueDeclareOk(
            queue=queue.name,
            message_count=queue.message_count,
            consumer_count=len(queue.consumers),
        )
        _reply_declare_ok(h, channel.id, reply, created=not existed)


def _reply_declare_ok(h: AmqpSession, channel_id: int, reply: m.Method, *, created: bool) -> None:
    """A declare that created its entity replies after a sync round (when the vhost has
    anything to sync); one that found it in place changed nothing durable and replies at
    once, as RabbitMQ, unless a definition change is still buffered (another connection's
    creation of it, say). Waiting there for the vhost's unrelated changes, other queues'
    acks among them, put an fsync round on every redeclare: kombu redeclares Celery's
    auto-delete `rpc://` reply queue before every task it sends (issue 30)."""
    if created or h.current_vhost().definitions.dirty:
        h.reply_durable(channel_id, reply, always=False)
    else:
        h.conn.send_method(channel_id, reply)


def _declare_reply_to(h: AmqpSession, channel: ChannelSession, method: m.QueueDeclare) -> None:
    """queue.declare passive of direct reply-to names, as RabbitMQ answers it."""
    if not reply_to.exists(h, method.queue):
        raise errors.NotFound(
            f"no queue '{method.queue}' in vhost '{h.current_vhost().name}'", 50, 10
        )
    if not method.nowait:
        h.conn.send_method(
            channel.id, m.QueueDeclareOk(queue=method.queue, message_count=0, consumer_count=1)
        )


def queue_bind(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.QueueBind)
    name = channel.queue_name(method.queue, (50, 20))
    # Spec: an empty queue name and routing key bind with the queue's name as key.
    routing_key = method.routing_key or (name if not method.queue else "")
    h.check_access("write", "queue", name, (50, 20))
    h.check_access("read", "exchange", method.exchange, (50, 20))
    access.check_topic_access(h, "read", method.exchange, routing_key, (50, 20))
    vhost = h.current_vhost()
    if method.exchange:  # vhost.bind refuses the default exchange before any lookup
        # RabbitMQ looks the exchange up first: a missing one is reported before a
        # missing or locked queue.
        vhost.exchange(method.exchange)
        vhost.queue(name, h)
    vhost.bind(Destination("queue", name), method.exchange, routing_key, method.arguments)
    if not method.nowait:
        h.reply_durable(channel.id, m.QueueBindOk(), always=False)


def queue_unbind(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.QueueUnbind)
    name = channel.queue_name(method.queue, (50, 50))
    h.check_access("write", "queue", name, (50, 50))
    h.check_access("read", "exchange", method.exchange, (50, 50))
    access.check_topic_access(h, "read", method.exchange, method.routing_key, (50, 50))
    vhost = h.current_vhost()
    destination = Destination("queue", name)
    exchange = vhost.exchanges.get(method.exchange)
    # The exclusive lock applies to a binding that exists: RabbitMQ checks it only then.
    if exchange is not None and exchange.has_binding(
        destination, method.routing_key, method.arguments
    ):
        vhost.queue(name, h)
    # A missing queue, exchange or binding is not an error (RabbitMQ).
    vhost.unbind(destination, method.exchange, method.routing_key, method.arguments)
    h.reply_durable(channel.id, m.QueueUnbindOk(), always=False)


def queue_purge(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.QueuePurge)
    name = channel.queue_name(method.queue, (50, 30))
    h.check_access("read", "queue", name, (50, 30))
    count = h.current_vhost().purge_queue(name, h)
    if not method.nowait:
        h.reply_durable(channel.id, m.QueuePurgeOk(message_count=count), always=False)


def queue_delete(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.QueueDelete)
    name = channel.queue_name(method.queue, (50, 40))
    h.check_access("configure", "queue", name, (50, 40))
    vhost = h.current_vhost()
    if name not in vhost.queues:
        # RabbitMQ: deleting a queue that does not exist succeeds with a count of 0.
        if not method.nowait:
            h.conn.send_method(channel.id, m.QueueDeleteOk(message_count=0))
        return
    queue = vhost.queue(name, h, usable=False)
    consumers = [c for c in queue.consumers if isinstance(c, GatewayConsumer)]
    count = vhost.delete_queue(name, method.if_unused, method.if_empty, h)
    # RabbitMQ 3.10 sends queue.delete-ok first: each consumer's channel hears of the
    # deletion later, from the queue process going down, and sends basic.cancel then.
    # A client waiting for the delete-ok must not see a cancel first (py-amqp, and kombu
    # over it, raise ConsumerCancelled from queue_delete), so this connection's cancels,
    # on any of its channels, follow the reply, which may wait for a sync round; this
    # connection's events are held until then. Other connections get theirs at once.
    own = [c for c in consumers if c.channel.connection is h.conn]
    for consumer in consumers:
        if consumer.channel.connection is not h.conn:
            consumer.cancel_by_broker()
    if method.nowait:
        _cancel_all(own)
        return
    reply = m.QueueDeleteOk(message_count=count)
    h.reply_durable(channel.id, reply, always=False, then=lambda: _cancel_all(own))


def _cancel_all(consumers: list[GatewayConsumer]) -> None:
    for consumer in consumers:
        consumer.cancel_by_broker()
