"""A session's channel methods: which handler takes each, and what an ended channel leaves.

Owns METHOD_HANDLERS (the exchange, queue, basic, confirm and tx methods, handled by
amqp_gateway/entity_methods.py and basic_methods.py), the dispatch of one method that a
session receives (`receive_method`: the channel's ChannelSession is made at channel.open,
and broker and log errors become AMQP ones), and `release_channel`: when a channel ends,
its consumers leave their queues and its unacked deliveries go back to them. The
functions take the session they work for, as amqp_gateway/publishing.py's do. The fast
path's runs of publishes and acks do not come through here (publishing.py,
`basic_methods.settle_ack_run`), and the protocol's own channel methods (open-ok, close,
close-ok) are amqp_gateway/connection.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from amqp_gateway import basic_methods, entity_methods, errors, reply_to
from amqp_gateway.channels import ChannelSession
from amqp_gateway.codec import methods as m
from amqp_gateway.errormap import to_amqp
from streamq.broker.errors import BrokerError
from streamq.log.errors import LogError

if TYPE_CHECKING:
    from amqp_gateway.session import AmqpSession

MethodHandler = Callable[["AmqpSession", ChannelSession, m.Method], None]
METHOD_HANDLERS: Final[dict[type[m.Method], MethodHandler]] = {
    m.ExchangeDeclare: entity_methods.exchange_declare,
    m.ExchangeDelete: entity_methods.exchange_delete,
    m.ExchangeBind: entity_methods.exchange_bind,
    m.ExchangeUnbind: entity_methods.exchange_unbind,
    m.QueueDeclare: entity_methods.queue_declare,
    m.QueueBind: entity_methods.queue_bind,
    m.QueueUnbind: entity_methods.queue_unbind,
    m.QueuePurge: entity_methods.queue_purge,
    m.QueueDelete: entity_methods.queue_delete,
    m.BasicQos: basic_methods.basic_qos,
    m.BasicConsume: basic_methods.basic_consume,
    m.BasicCancel: basic_methods.basic_cancel,
    m.BasicGet: basic_methods.basic_get,
    m.BasicAck: basic_methods.basic_ack,
    m.BasicNack: basic_methods.basic_nack,
    m.BasicReject: basic_methods.basic_reject,
    m.BasicRecover: basic_methods.basic_recover,
    m.BasicRecoverAsync: basic_methods.basic_recover,
    m.ChannelFlow: basic_methods.channel_flow,
    m.ConfirmSelect: basic_methods.confirm_select,
    m.TxSelect: basic_methods.tx_select,
    m.TxCommit: basic_methods.tx_commit,
    m.TxRollback: basic_methods.tx_rollback,
    m.AccessRequest: basic_methods.access_request,
}


def receive_method(s: AmqpSession, channel_id: int, method: m.Method) -> None:
    """Handle `method` on `channel_id`; raises an AMQPError when it fails."""
    channel = s.channels.get(channel_id)
    if channel is None:
        channel = s.channels[channel_id] = ChannelSession(channel_id, s.conn, s)
        if isinstance(method, m.ChannelOpen):
            return  # listed from now on (the management API shows open channels)
    handler = METHOD_HANDLERS.get(type(method))
    if handler is None:
        # RabbitMQ's words for a method its channel has no clause for (rabbit_channel).
        raise errors.CommandInvalid("unimplemented method", method.CLASS_ID, method.METHOD_ID)
    try:
        handler(s, channel, method)
    except (BrokerError, LogError) as exc:
        raise to_amqp(exc, method.CLASS_ID, method.METHOD_ID) from exc


def channel_closed(s: AmqpSession, channel_id: int) -> None:
    channel = s.channels.pop(channel_id, None)
    if channel is not None:
        release_channel(s, channel)


def release_channel(s: AmqpSession, channel: ChannelSession) -> None:
    vhost = s.vhost
    if vhost is None:
        return
    reply_to.forget(s, channel)
    for consumer in list(channel.consumers.values()):
        vhost.remove_consumer(consumer.queue, consumer)
    channel.consumers.clear()
    # Unacked deliveries go back to their queues in their original order, with those
    # an uncommitted transaction acked.
    channel.restore_held()
    entries = [(entry.queue, entry.offset, None) for entry in channel.unacked.values()]
    vhost.requeue_many(entries, deliver=False)
    channel.unacked.clear()
