"""Direct reply-to: the `amq.rabbitmq.reply-to` pseudo-queue, as RabbitMQ serves it.

Owns the reply consumers: a channel that consumes `amq.rabbitmq.reply-to` (with no-ack,
one per channel) gets a name `amq.rabbitmq.reply-to.<suffix>`; its requests' `reply_to`
is rewritten to that name (`routing.py`), and a publish to the default exchange with it
as routing key is delivered straight to that channel: no queue, no log, no ack. A reply
to a channel that is gone is dropped. As in RabbitMQ 3.x, the name is not a queue, so a
reply published with `mandatory` is returned as unroutable (312 NO_ROUTE) even when it
was delivered. Replies are not kept across a restart (nor are they in RabbitMQ).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Final

from amqp_gateway import codec, errors
from amqp_gateway.channels import ChannelSession
from amqp_gateway.codec import methods as m

if TYPE_CHECKING:
    from amqp_gateway.session import AmqpSession

REPLY_TO_QUEUE: Final = "amq.rabbitmq.reply-to"
REPLY_PREFIX: Final = REPLY_TO_QUEUE + "."
SUFFIX_BYTES: Final = 18  # random bytes of a reply name: not guessable


def consume(h: AmqpSession, channel: ChannelSession, method: m.BasicConsume) -> None:
    """basic.consume on `amq.rabbitmq.reply-to` (RabbitMQ's checks and texts)."""
    tag = method.consumer_tag
    if tag and (tag in channel.consumers or tag == channel.reply_tag):
        raise errors.NotAllowed(f"attempt to reuse consumer tag '{tag}'", 60, 20)
    if not method.no_ack:
        raise errors.PreconditionFailed("reply consumer cannot acknowledge", 60, 20)
    if channel.reply_tag is not None:
        raise errors.PreconditionFailed("reply consumer already set", 60, 20)
    tag = tag or "amq.ctag-" + secrets.token_urlsafe(16)
    suffix = secrets.token_urlsafe(SUFFIX_BYTES)
    channel.reply_tag = tag
    channel.reply_suffix = suffix
    h.gateway.reply_channels[suffix] = channel
    if not method.nowait:
        h.conn.send_method(channel.id, m.BasicConsumeOk(consumer_tag=tag))


def cancel(h: AmqpSession, channel: ChannelSession, method: m.BasicCancel) -> bool:
    """basic.cancel of the reply consumer; False if `method` names another consumer."""
    if channel.reply_tag is None or method.consumer_tag != channel.reply_tag:
        return False
    forget(h, channel)
    if not method.nowait:
        h.conn.send_method(channel.id, m.BasicCancelOk(consumer_tag=method.consumer_tag))
    return True


def forget(h: AmqpSession, channel: ChannelSession) -> None:
    """The reply consumer is cancelled or its channel closed: later replies are dropped."""
    if channel.reply_suffix is not None:
        h.gateway.reply_channels.pop(channel.reply_suffix, None)
    channel.reply_tag = None
    channel.reply_suffix = None


def exists(h: AmqpSession, name: str) -> bool:
    """queue.declare passive: the pseudo-queue always exists; a reply name while its
    consumer does."""
    if name == REPLY_TO_QUEUE:
        return True
    return name.startswith(REPLY_PREFIX) and name[len(REPLY_PREFIX) :] in h.gateway.reply_channels


def deliver(h: AmqpSession, routing_key: str, properties_raw: bytes, body: bytes) -> bool:
    """Deliver a reply published to the default exchange with `routing_key`; False if
    no reply consumer has that name (the reply is dropped)."""
    channel = h.gateway.reply_channels.get(routing_key[len(REPLY_PREFIX) :])
    if channel is None or channel.reply_tag is None:
        return False
    connection = channel.connection
    if not connection.is_channel_open(channel.id):
        return False
    codec.encode_deliver(
        connection.outgoing,
        codec.ChannelId(channel.id),
        channel.reply_tag,
        codec.DeliveryTag(channel.take_tag()),
        False,
        "",
        routing_key,
        properties_raw,
        body,
        connection.frame_max,
    )
    channel.owner.note_output()
    return True
