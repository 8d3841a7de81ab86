"""Publishing and confirms: what an AMQP session does with the messages it reads.

Owns the path of a published message from a session's events to the log: routing
(`route`), storing or returning it (`store`), runs of publishes stored in one step
(`publish_run`, the hot path), and publisher confirms once a sync round made them durable
(`confirm_loop`, one task per connection at most, one cumulative ack per channel). Each
function takes the session it works for, as `basic_methods` does; none touches a socket:
what they send goes to the session's outgoing buffer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from amqp_gateway import codec, errors, reply_to, routing
from amqp_gateway.access import TOPIC_TYPE
from amqp_gateway.channels import ChannelSession, RoutedPublish
from amqp_gateway.codec import methods as m
from amqp_gateway.errormap import to_amqp
from amqp_gateway.events import Publish, PublishRun, RunMessage
from amqp_gateway.reply_to import REPLY_PREFIX
from amqp_gateway.states import State
from streamq.broker.stats import MessageStats
from streamq.broker.vhost import VHost
from streamq.log.errors import LogError, fenced

if TYPE_CHECKING:
    from amqp_gateway.session import AmqpSession

logger = logging.getLogger(__name__)

_IMMEDIATE: Final = 2  # basic.publish's second bit


def publish(s: AmqpSession, publish: Publish) -> bool:
    """Route and store one message; True if a confirm is now owed."""
    if s.conn.is_channel_closing(publish.channel):
        return False  # see publish_run
    channel = s.channel(publish.channel)
    vhost = s.vhost
    assert vhost is not None
    if publish.immediate:
        raise errors.AMQPNotImplemented("immediate=true", 60, 40)
    s.check_access("write", "exchange", publish.exchange, (60, 40))
    if channel.transactional:
        # As RabbitMQ 3.10: checked and routed now, stored (or returned) at commit.
        channel.tx_publishes.append(route(s, vhost, channel, publish))
        return False
    if channel.confirm:
        channel.publish_seq += 1
        try:
            route_and_store(s, vhost, channel, publish)
        except Exception:
            channel.publish_seq -= 1  # not stored: nothing to confirm for it
            raise
        return True
    route_and_store(s, vhost, channel, publish)
    return False


def publish_run(s: AmqpSession, run: PublishRun) -> bool:
    """Route and store a run of publishes (one channel, exchange and routing key);
    True if confirms are owed. The common case routes once and stores the lot in one
    step; anything else (a transaction, immediate, a slow-path property, no route, a
    queue with a length limit, a stream) goes through `publish` one by one."""
    if s.conn.is_channel_closing(run.channel):
        # An error earlier in this read closed the channel: what the client sent on it
        # before it saw the close is discarded (connection.py, rule 2), as RabbitMQ.
        # The client's own channel.close is parsed only once these are handled
        # (connection.py, rule 3).
        return False
    channel = s.channel(run.channel)
    if channel.transactional or run.bits & _IMMEDIATE or not _store_run(s, channel, run):
        channel_id = run.channel
        publish_one = publish
        for properties_raw, body, exchange, routing_key, bits in run.messages:
            publish_one(
                s,
                Publish(
                    channel_id,
                    exchange,
                    routing_key,
                    bool(bits & 1),
                    bool(bits & _IMMEDIATE),
                    properties_raw,
                    body,
                ),
            )
    return channel.confirm and not channel.transactional


def _store_run(s: AmqpSession, channel: ChannelSession, run: PublishRun) -> bool:
    """`route_and_store` of a whole run when its common case holds; False, having
    stored nothing, otherwise."""
    vhost = s.vhost
    assert vhost is not None
    messages = run.messages
    _, _, exchange_name, routing_key, _ = messages[0]
    exchange = vhost.exchanges.get(exchange_name)
    if (
        exchange is None
        or exchange.internal
        or exchange.reads_properties
        or vhost.queue_dedupers
        or (
            run.flags & routing.SLOW_FLAGS
            and any(routing.needs_slow_path(vhost, exchange, m[0]) for m in messages)
        )
        or (run.flags & routing.CHECKED_FLAGS and not _pass_checks(s, messages))
    ):
        return False
    s.check_access("write", "exchange", exchange_name, (60, 40))
    if exchange.type == TOPIC_TYPE:
        # Once per run: a run has one exchange and routing key.
        _check_topic_write(s, exchange_name, routing_key)
    queues = vhost.route_run(exchange_name, routing_key)
    # None: the route reads properties; []: unroutable (mandatory, direct reply-to).
    if not queues or not vhost.publish_run(
        exchange_name, routing_key, messages, queues, s.now_ms, run.flags >> 8
    ):
        return False
    count = len(messages)
    stats = vhost.exchange_stats.get(exchange_name)
    if stats is None:
        stats = vhost.exchange_stats[exchange_name] = MessageStats()
    stats.publish_in += count
    stats.publish_out += count
    if channel.confirm:
        channel.publish_seq += count
    for queue in queues:  # publisher flow control: one flag per routed queue
        if queue.in_flow:
            s.flow_queue = queue
    return True


def _pass_checks(s: AmqpSession, messages: list[RunMessage]) -> bool:
    """Whether every message of a run passes `routing.check_properties`; if one does
    not, the run goes one by one and the publishes before it are stored. Equal
    consecutive properties are one object: each is checked once."""
    previous = None
    for message in messages:
        properties_raw = message[0]
        if properties_raw is not previous and routing.needs_check(properties_raw):
            try:
                routing.check_properties(properties_raw, s.user, s.impersonator)
            except errors.PreconditionFailed:
                return False
        previous = properties_raw
    return True


def _check_topic_write(s: AmqpSession, exchange_name: str, routing_key: str) -> None:
    """RabbitMQ's topic write check of a publish to a topic exchange, after the exchange
    is known to exist and not to be internal (rabbit_channel's basic.publish); one dict
    lookup when the user has no topic permissions in the vhost."""
    permissions = s.permissions
    assert permissions is not None  # publishes come only once the connection is open
    permissions.check_topic("write", exchange_name, routing_key, (60, 40))


def route_and_store(
    s: AmqpSession, vhost: VHost, channel: ChannelSession, publish: Publish
) -> None:
    store(s, vhost, channel, route(s, vhost, channel, publish))


def route(s: AmqpSession, vhost: VHost, channel: ChannelSession, publish: Publish) -> RoutedPublish:
    """The queues `publish` goes to, and its properties as stored. Raises NotFound
    (404) and AccessRefused (403) for its exchange, and what routing raises."""
    exchange = vhost.exchanges.get(publish.exchange)
    if exchange is None:
        raise errors.NotFound(f"no exchange '{publish.exchange}' in vhost '{vhost.name}'", 60, 40)
    if exchange.internal:
        raise errors.AccessRefused(
            f"cannot publish to internal exchange '{publish.exchange}' in vhost '{vhost.name}'",
            60,
            40,
        )
    if exchange.type == TOPIC_TYPE:
        _check_topic_write(s, publish.exchange, publish.routing_key)
    # Message stats: one dict lookup and a few increments per publish.
    stats = vhost.exchange_stats.get(publish.exchange)
    if stats is None:
        stats = vhost.exchange_stats[publish.exchange] = MessageStats()
    stats.publish_in += 1
    properties_raw = publish.properties_raw
    if routing.needs_check(properties_raw):
        routing.check_properties(properties_raw, s.user, s.impersonator)
    # Hot path: two flags and one flag-byte test decide that nothing below applies.
    if (
        exchange.reads_properties
        or vhost.queue_dedupers
        or (
            properties_raw
            and properties_raw[0] & routing.SLOW_FLAGS_BYTE0
            and routing.needs_slow_path(vhost, exchange, properties_raw)
        )
    ):
        routed = routing.route_publish(
            vhost,
            exchange,
            publish.routing_key,
            properties_raw,
            publish.body,
            s.now_ms,
            channel.reply_suffix,
        )
        queues, properties_raw = routed.queues, routed.properties_raw
        reply = not routed.held
        routed_later = routed.routed_later
    else:
        # The headers are decoded only if the route reaches an exchange that reads
        # them (a headers exchange bound to this one).
        queues = vhost.route(
            publish.exchange, publish.routing_key, None, properties_raw=properties_raw
        )
        reply = not queues
        routed_later = False
    return RoutedPublish(publish, queues, properties_raw, reply, routed_later, stats)


def store(s: AmqpSession, vhost: VHost, channel: ChannelSession, routed: RoutedPublish) -> None:
    """Store a routed publish, or return it (mandatory) or drop it if it went nowhere."""
    publish, queues, properties_raw, reply, routed_later, stats = routed
    offset = vhost.publish(
        publish.exchange,
        publish.routing_key,
        properties_raw,
        publish.body,
        queues,
        s.now_ms,
    )
    for queue in queues:  # publisher flow control: one flag per routed queue
        if queue.in_flow:
            s.flow_queue = queue
    if vhost.publisher.publish_rejected and channel.confirm:
        channel.rejected_seqs.append(channel.publish_seq)
    if reply and publish.exchange == "" and publish.routing_key.startswith(REPLY_PREFIX):
        # Direct reply-to; still unrouted for `mandatory`, as RabbitMQ 3.x.
        reply_to.deliver(s, publish.routing_key, properties_raw, publish.body)
    if offset is not None or routed_later:
        stats.publish_out += 1
    elif not publish.mandatory:
        vhost.stats.drop_unroutable += 1
    else:
        vhost.stats.return_unroutable += 1
        s.conn.send_content(
            channel.id,
            m.BasicReturn(
                reply_code=312,
                reply_text="NO_ROUTE",
                exchange=publish.exchange,
                routing_key=publish.routing_key,
            ),
            properties_raw,
            publish.body,
        )


async def confirm_loop(s: AmqpSession) -> None:
    """Confirm publishes once the log has made them durable: one sync round covers
    every publish so far on every channel, and each channel gets one cumulative ack."""
    try:
        while s.vhost is not None and s.conn.state is State.OPEN:
            owed = {
                channel: channel.publish_seq
                for channel in s.channels.values()
                if channel.confirm
                and channel.publish_seq > channel.confirmed_seq
                and not s.conn.is_channel_closing(channel.id)
            }
            if not owed:
                return
            await s.vhost.sync()
            for channel, seq in owed.items():
                # Nothing goes out on a channel after its channel.close (spec 1.5.2.5):
                # what a failed channel owed was confirmed before it (AmqpSession.fail).
                if (
                    s.channels.get(channel.id) is channel
                    and seq > channel.confirmed_seq
                    and not s.conn.is_channel_closing(channel.id)
                ):
                    confirm(s, channel, seq)
            s.flush()
    except LogError as exc:
        # A node that stepped down as cluster leader closes every publisher this way:
        # expected, not a store failure.
        log = logger.info if fenced(exc) else logger.error
        log("message store failed; closing connection %s: %s", s.peer, exc)
        s.fail(to_amqp(exc, 60, 40), 0)
        s.flush()
    finally:
        s.confirming = False


def confirm(s: AmqpSession, channel: ChannelSession, seq: int) -> None:
    """Cumulative acks up to `seq`, with a nack for each publish a full queue refused
    (x-overflow reject-publish), in order."""
    out = s.conn.outgoing
    channel_id = codec.ChannelId(channel.id)
    done = channel.confirmed_seq
    rejected = channel.rejected_seqs
    while rejected and rejected[0] <= seq:
        refused = rejected.pop(0)
        if refused - 1 > done:
            codec.append_basic_ack(out, channel_id, codec.DeliveryTag(refused - 1), True)
        s.conn.send_method(
            channel.id,
            m.BasicNack(delivery_tag=codec.DeliveryTag(refused), multiple=False, requeue=False),
        )
        done = refused
    if seq > done:
        codec.append_basic_ack(out, channel_id, codec.DeliveryTag(seq), True)
    if s.vhost is not None:
        s.vhost.stats.confirm += seq - channel.confirmed_seq
    channel.confirmed_seq = seq
