"""The basic, confirm, tx and channel.flow methods, server side: one function per method.

Owns consumers, basic.get, acks and their requeue rules, qos, publisher confirm mode and
transactions as seen from one channel. Publishes themselves take the session's hot path
(`publishing.route` and `store`); deliveries are the vhost's drain.
"""

from __future__ import annotations

import secrets
import time
from operator import attrgetter
from typing import TYPE_CHECKING, Final

from amqp_gateway import codec, errors, publishing, reply_to
from amqp_gateway.channels import (
    ChannelSession,
    GatewayConsumer,
    Unacked,
    monotonic_ms,
    settle_groups,
    with_long_header,
)
from amqp_gateway.codec import methods as m
from amqp_gateway.errormap import to_amqp
from amqp_gateway.events import AckRun, MethodReceived
from amqp_gateway.stream_offsets import parse_stream_filter, parse_stream_offset
from streamq.broker.equivalence import type_name
from streamq.broker.errors import BrokerError
from streamq.broker.streams import track_run
from streamq.log.errors import LogError
from streamq.queues.offsets import AckWatermark

if TYPE_CHECKING:
    from amqp_gateway.session import AmqpSession
    from streamq.broker.queue import Queue
    from streamq.broker.vhost import VHost


def basic_qos(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.BasicQos)
    if method.prefetch_size != 0:
        raise errors.AMQPNotImplemented(f"prefetch_size!=0 ({method.prefetch_size})", 60, 10)
    if method.global_:
        channel.set_channel_prefetch(method.prefetch_count)
    else:
        # Per-consumer prefetch applies to consumers started after it, and lifts the
        # channel's global one (RabbitMQ's unlimit_prefetch): one mode at a time.
        channel.consumer_prefetch = method.prefetch_count
        channel.set_channel_prefetch(0)
    h.conn.send_method(channel.id, m.BasicQosOk())
    channel.unblock_consumers()
    for consumer in channel.consumers.values():
        h.current_vhost().kick(consumer.queue)


def basic_consume(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.BasicConsume)
    if method.queue == reply_to.REPLY_TO_QUEUE:
        reply_to.consume(h, channel, method)
        return
    name = channel.queue_name(method.queue, (60, 20))
    h.check_access("read", "queue", name, (60, 20))
    vhost = h.current_vhost()
    queue = vhost.queue(name, h)
    tag = method.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
    if tag in channel.consumers:
        raise errors.NotAllowed(f"attempt to reuse consumer tag '{tag}'", 60, 20)
    consumer = GatewayConsumer(
        channel, queue, tag, method.no_ack, method.exclusive, channel.consumer_prefetch
    )
    priority = method.arguments.get("x-priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise errors.PreconditionFailed(
            f"invalid arg 'x-priority' for queue '{name}' in vhost '{vhost.name}': "
            f'"expected integer, got {type_name(priority)}"',
            60,
            20,
        )
    consumer.priority = priority
    consumer.timeout_ms = _consumer_timeout(method)
    if queue.stream is not None:
        _check_stream_consumer(channel, method, vhost.name, name)
        start = parse_stream_offset(
            method.arguments.get("x-stream-offset"), int(time.time() * 1000)
        )
        consumer.stream_position = queue.stream.start_offset(start)
        consumer.stream_filter = parse_stream_filter(method.arguments)
        if _tracking(method, tag):
            stored = queue.stream.offsets.get(tag)
            if stored is not None:  # a reconnect: resume after what it acked
                consumer.stream_position = max(stored + 1, queue.stream.log.start_offset)
            consumer.stream_tracker = AckWatermark(consumer.stream_position)
    vhost.add_consumer(queue, consumer)  # raises before consume-ok if refused
    channel.consumers[tag] = consumer
    if not method.nowait:
        h.conn.send_method(channel.id, m.BasicConsumeOk(consumer_tag=tag))


def _consumer_timeout(method: m.BasicConsume) -> int | None:
    """x-consumer-timeout on basic.consume (RabbitMQ 3.12): ms, 0 for none."""
    value = method.arguments.get("x-consumer-timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise errors.PreconditionFailed(
            f"invalid arg 'x-consumer-timeout': expected a non-negative integer, got {value!r}",
            60,
            20,
        )
    return int(value)


def _check_stream_consumer(
    channel: ChannelSession, method: m.BasicConsume, vhost: str, name: str
) -> None:
    """RabbitMQ's rules for consuming from a stream: manual acks and a prefetch."""
    where = f"queue '{name}' in vhost '{vhost}'"
    if channel.consumer_prefetch == 0:
        raise errors.PreconditionFailed(f"consumer prefetch count is not set for '{where}'", 60, 20)
    if method.no_ack:
        raise errors.AMQPNotImplemented(
            f"automatic acknowledgement not supported by stream queues {where}", 60, 20
        )


def _tracking(method: m.BasicConsume, tag: str) -> bool:
    """`x-stream-automatic-offset-tracking` (LavinMQ's convention): needs a named tag."""
    value = method.arguments.get("x-stream-automatic-offset-tracking", False)
    if value in ("true", b"true"):
        value = True
    if not isinstance(value, bool):
        raise errors.PreconditionFailed(
            f"invalid x-stream-automatic-offset-tracking {value!r}: expected a boolean", 60, 20
        )
    if value and not method.consumer_tag:
        raise errors.PreconditionFailed(
            "x-stream-automatic-offset-tracking needs a consumer tag chosen by the client "
            "(the offset is stored under it)",
            60,
            20,
        )
    return value


def basic_cancel(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.BasicCancel)
    if reply_to.cancel(h, channel, method):
        return
    consumer = channel.consumers.pop(method.consumer_tag, None)
    if consumer is not None:
        h.current_vhost().remove_consumer(consumer.queue, consumer)
    if not method.nowait:
        h.conn.send_method(channel.id, m.BasicCancelOk(consumer_tag=method.consumer_tag))


def basic_get(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.BasicGet)
    name = channel.queue_name(method.queue, (60, 70))
    h.check_access("read", "queue", name, (60, 70))
    vhost = h.current_vhost()
    queue = vhost.queue(name, h)
    if queue.stream is not None:
        raise errors.AMQPNotImplemented(
            f"basic.get not supported by stream queues queue '{name}' in vhost '{vhost.name}'",
            60,
            70,
        )
    queue.last_used_s = time.monotonic()  # basic.get renews the x-expires lease
    taken = vhost.get(queue, int(time.time() * 1000))
    if taken is None:
        h.conn.send_method(channel.id, m.BasicGetEmpty())
        return
    ready, record = taken
    tag = channel.take_tag()
    h.conn.send_content(
        channel.id,
        m.BasicGetOk(
            delivery_tag=codec.DeliveryTag(tag),
            redelivered=ready.redelivered,
            exchange=record.exchange.decode("utf-8", "surrogateescape"),
            routing_key=record.routing_key.decode("utf-8", "surrogateescape"),
            message_count=queue.cursor.message_count,
        ),
        with_long_header(record.properties, "x-delivery-count", ready.delivery_count)
        if ready.delivery_count
        else record.properties,
        record.body,
    )
    if method.no_ack:
        queue.stats.get_no_ack += 1
        vhost.settle(queue, ready.offset)
    else:
        queue.stats.get += 1
        channel.unacked[tag] = Unacked(queue, ready.offset, None, monotonic_ms())


def settle(
    h: AmqpSession,
    channel: ChannelSession,
    tag: int,
    multiple: bool,
    ack: bool,
    requeue: bool,
    ids: tuple[int, int],
) -> None:
    if channel.transactional:
        # The tags are checked now and leave the unacked ones (RabbitMQ's collect_acks):
        # naming one twice in a transaction is a 406 at once. Commit applies them.
        held = channel.hold_tags(tag, multiple)
        if not held and not (multiple and tag == 0):
            raise errors.PreconditionFailed(f"unknown delivery tag {tag}", *ids)
        channel.tx_acks.append((held, ack, requeue))
        return
    if not ack:
        held = channel.hold_tags(tag, multiple)
        if not held and not (multiple and tag == 0):
            raise errors.PreconditionFailed(f"unknown delivery tag {tag}", *ids)
        settle_in_groups(h, channel, held, requeue)
        return
    settled = channel.settle_tags(tag, multiple)
    if not settled and not (multiple and tag == 0):
        raise errors.PreconditionFailed(f"unknown delivery tag {tag}", *ids)
    apply_settle(h, channel, settled, ack, requeue)


def settle_in_groups(
    h: AmqpSession, channel: ChannelSession, held: dict[int, Unacked], requeue: bool
) -> None:
    """A nack, reject or recover as RabbitMQ's channel applies it: group by group
    (`settle_groups`), each group's consumer gets its credit back, then its messages go
    back (dropped from the head over a length limit) or are dead-lettered, and the queue
    delivers before the next group. The last group's deliveries wait for the end of the
    loop turn, as all deliveries do, so that replies the client asked for before them
    come first (RabbitMQ's come from another process)."""
    vhost = h.current_vhost()
    groups = settle_groups(held)
    for index, group in enumerate(groups):
        channel.release(group)
        queue, more = group[0].queue, index + 1 < len(groups)
        if requeue:
            entries = [(entry.queue, entry.offset, entry.consumer) for entry in group]
            vhost.requeue_many(entries, deliver=more)
        else:
            for entry in group:
                vhost.reject(entry.queue, entry.offset, entry.consumer)
            if more:
                vhost.deliver_now(queue)
        vhost.kick(queue)
    if channel.channel_prefetch:
        for consumer in channel.consumers.values():
            vhost.kick(consumer.queue)


def settle_plain_acks(
    h: AmqpSession, channel: ChannelSession, tags: list[int], kinds: bytes, start: int, end: int
) -> int:
    """Hot path: the plain acks (multiple=false) of a run from `start` on, before `end`,
    settled in one step (one pop per tag, one release, one `settle_classic` per queue);
    returns the index of the first entry it did not settle. Below `end`, the caller hands
    that entry to the per-method path: a nack, a reject, an ack with `multiple`, an
    unknown tag (406 there, with the acks before it applied and those after it
    untouched, as one ack after another). A transactional channel settles nothing here:
    `settle` holds its acks for the commit.
    """
    if channel.transactional:
        return start
    # The entries up to the first nonzero kind byte are plain acks (C-level strip).
    stop = end - len(kinds[start:end].lstrip(b"\x00"))
    if stop == start:
        return start
    plain = tags if start == 0 and stop == len(tags) else tags[start:stop]
    settled = channel.settle_run(plain)
    if settled:
        apply_settle(h, channel, settled, True, False)
    return start + len(settled)


# The kind bytes of a single nack or reject with requeue (multiple=false), as
# `codec.scan_acks` sets them: the entries `requeue_stretch` gives back together.
_REQUEUE_ONE: Final = frozenset(
    (codec.ACK_NACK | codec.ACK_REQUEUE, codec.ACK_REJECT | codec.ACK_REQUEUE)
)


def requeue_stretch(
    h: AmqpSession, channel: ChannelSession, tags: list[int], kinds: bytes, start: int, end: int
) -> int:
    """Hot path of requeue-heavy consumers: the single nacks and rejects with requeue of
    a run from `start` on, before `end`, while they name deliveries of one queue and one
    consumer, given back as one group (`settle_in_groups`), which leaves the queue as
    one method after another does: each goes back to its place by offset, and the
    deliveries wait for the drain either way. Returns the index of the first entry not
    given back: an unknown tag (406 on the per-method path), another group, an ack. A
    transactional channel gives back nothing here (`settle` holds them for the commit).
    """
    if channel.transactional:
        return start
    unacked = channel.unacked
    group: tuple[object, object] | None = None
    stop = start
    while stop < end and kinds[stop] in _REQUEUE_ONE:
        entry = unacked.get(tags[stop])
        if entry is None or entry.consumer is None:
            break  # unknown, or a basic.get delivery: a group of its own (settle_groups)
        if group is not None and group != (entry.queue, entry.consumer):
            break
        group = (entry.queue, entry.consumer)
        stop += 1
    if stop == start or len(set(tags[start:stop])) < stop - start:
        return start  # none, or a tag named twice: one at a time decides
    held = {tag: unacked.pop(tag) for tag in tags[start:stop]}
    settle_in_groups(h, channel, held, True)
    return stop


def apply_settle(
    h: AmqpSession, channel: ChannelSession, settled: list[Unacked], ack: bool, requeue: bool
) -> None:
    """Ack, requeue or reject `settled`, taken from the channel's unacked deliveries."""
    vhost = h.current_vhost()
    if channel.channel_prefetch:
        # A global prefetch limits every consumer of the channel: the credit freed here
        # may be another queue's consumer's turn.
        for consumer in channel.consumers.values():
            vhost.kick(consumer.queue)
    if ack:
        _ack(vhost, settled)
        return
    if requeue:
        vhost.requeue_many(
            [(entry.queue, entry.offset, entry.consumer) for entry in settled], deliver=False
        )
    else:
        for entry in settled:
            vhost.reject(entry.queue, entry.offset, entry.consumer)
    for entry in settled:
        vhost.kick(entry.queue)


_QUEUE_OF = attrgetter("queue")
_OFFSET_OF = attrgetter("offset")
_CONSUMER_OF = attrgetter("consumer")


def _ack(vhost: VHost, settled: list[Unacked]) -> None:
    """Acks, grouped by queue: one settle call, one count and one kick per queue rather
    than per message (an ack with `multiple`, or a read full of plain acks, settles
    hundreds at once). A stream's acks move each consumer's tracked offset once per run."""
    queues: set[Queue] = set(map(_QUEUE_OF, settled))
    if len(queues) == 1:  # the common case: one queue, its offsets taken in C
        [only] = queues
        if only.stream is None:
            taken: list[int] = list(map(_OFFSET_OF, settled))
            only.stats.ack += len(taken)
            vhost.settle_classic(only, taken)
        else:
            _ack_stream(only, settled)
        vhost.kick(only)
        return
    groups: dict[Queue, list[Unacked]] = {}
    for entry in settled:
        entries = groups.get(entry.queue)
        if entries is None:
            entries = groups[entry.queue] = []
        entries.append(entry)
    for queue, entries in groups.items():
        if queue.stream is None:
            offsets = list(map(_OFFSET_OF, entries))
            queue.stats.ack += len(offsets)
            vhost.settle_classic(queue, offsets)
        else:
            _ack_stream(queue, entries)
        vhost.kick(queue)


def _ack_stream(queue: Queue, settled: list[Unacked]) -> None:
    """Acks of one stream's deliveries: reading a stream consumes nothing, so an ack only
    returned credit (already) and moves its consumer's tracked offset, once per
    consumer for the run (`streams.track_run`)."""
    stream = queue.stream
    assert stream is not None
    queue.stats.ack += len(settled)
    consumers = set(map(_CONSUMER_OF, settled))
    if len(consumers) == 1:  # the common case: one consumer, its offsets taken in C
        [consumer] = consumers
        if consumer is not None and consumer.stream_tracker is not None:
            track_run(stream, consumer, list(map(_OFFSET_OF, settled)))
        return
    runs: dict[GatewayConsumer, list[int]] = {}
    for entry in settled:
        consumer = entry.consumer
        if consumer is not None and consumer.stream_tracker is not None:
            offsets = runs.get(consumer)
            if offsets is None:
                offsets = runs[consumer] = []
            offsets.append(entry.offset)
    for consumer, offsets in runs.items():
        track_run(stream, consumer, offsets)


def settle_ack_run(h: AmqpSession, run: AckRun) -> None:
    """Settle a run of acks, nacks and rejects, in their order, as one per-method
    event after another would: the plain acks (multiple=false, the common case) in
    one step each stretch (`settle_plain_acks`), every other entry through the
    per-method path, which knows every rule (transactions, requeue, `multiple`, the 406
    of an unknown tag). The rest of a run is discarded once its channel closes, and held
    when a reply waits, as `AmqpSession.handle_events` does with events."""
    channel_id, tags, kinds = run.channel, run.tags, run.kinds
    start, count = 0, len(tags)
    piece = h.channel(channel_id).ack_piece()
    while start < count:
        if h.conn.is_channel_closing(channel_id):
            return  # connection.py, rule 2: see MethodReceived in handle_events
        if h.reply_pending():
            h.hold(AckRun(channel_id, tags[start:], kinds[start:], run.flags))
            return
        if h.acks_since_drain >= piece and h.gateway.drain_pending:
            # The credit of a piece of acks goes out as deliveries before the next
            # piece is settled (channels.PIECES_PER_WINDOW).
            h.acks_since_drain = 0
            h.gateway.drain_early()
        end = min(count, start + piece)
        try:
            settled = settle_plain_acks(h, h.channel(channel_id), tags, kinds, start, end)
        except (BrokerError, LogError) as exc:
            raise to_amqp(exc, 60, 80) from exc  # as _method maps basic.ack's
        h.acks_since_drain += settled - start
        start = settled
        if start < end:
            channel = h.channel(channel_id)
            try:
                given = requeue_stretch(h, channel, tags, kinds, start, end)
            except (BrokerError, LogError) as exc:
                raise to_amqp(exc, 60, 120) from exc  # as _method maps basic.nack's
            if given > start:
                start = given
                continue
            method = ack_method(tags[start], kinds[start])
            h.handle_events([MethodReceived(channel_id, method)])
            start += 1


def ack_method(tag: int, kind: int) -> m.BasicAck | m.BasicNack | m.BasicReject:
    """The method an entry of an AckRun stands for (its kind bits as `codec.scan_acks`
    sets them), for the per-method path."""
    delivery_tag = codec.DeliveryTag(tag)
    multiple = bool(kind & codec.ACK_MULTIPLE)
    requeue = bool(kind & codec.ACK_REQUEUE)
    if kind & codec.ACK_NACK:
        return m.BasicNack(delivery_tag, multiple, requeue)
    if kind & codec.ACK_REJECT:
        return m.BasicReject(delivery_tag, requeue)
    return m.BasicAck(delivery_tag, multiple)


def basic_ack(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.BasicAck)
    settle(h, channel, method.delivery_tag, method.multiple, True, False, (60, 80))


def basic_nack(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.BasicNack)
    settle(h, channel, method.delivery_tag, method.multiple, False, method.requeue, (60, 120))


def basic_reject(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.BasicReject)
    settle(h, channel, method.delivery_tag, False, False, method.requeue, (60, 90))


def basic_recover(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    # requeue=false would mean redelivering to the same consumer: RabbitMQ refuses
    # it with 540 (a connection error); requeue=true requeues every unacked delivery.
    if not getattr(method, "requeue", True):
        raise errors.AMQPNotImplemented("requeue=false", method.CLASS_ID, method.METHOD_ID)
    if isinstance(method, m.BasicRecover):
        h.conn.send_method(channel.id, m.BasicRecoverOk())  # before the redeliveries
    settle_in_groups(h, channel, channel.hold_tags(0, True), True)


def channel_flow(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.ChannelFlow)
    channel.flow_active = method.active
    h.conn.send_method(channel.id, m.ChannelFlowOk(active=method.active))
    if method.active:
        channel.unblock_consumers()
        for consumer in channel.consumers.values():
            h.current_vhost().kick(consumer.queue)


def confirm_select(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    assert isinstance(method, m.ConfirmSelect)
    if channel.transactional:
        raise errors.PreconditionFailed("cannot switch from tx to confirm mode", 85, 10)
    channel.confirm = True
    if not method.nowait:
        h.conn.send_method(channel.id, m.ConfirmSelectOk())


def tx_select(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    if channel.confirm:
        raise errors.PreconditionFailed("cannot switch from confirm to tx mode", 90, 10)
    channel.transactional = True
    h.conn.send_method(channel.id, m.TxSelectOk())


def tx_commit(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    if not channel.transactional:
        raise errors.PreconditionFailed("channel is not transactional", 90, 20)
    vhost = h.current_vhost()
    acks, channel.tx_acks = channel.tx_acks, []
    publishes, channel.tx_publishes = channel.tx_publishes, []
    for held, ack, requeue in acks:
        settled = list(held.values())
        channel.release(settled)
        apply_settle(h, channel, settled, ack, requeue)
    for routed in publishes:
        # A queue deleted since the publish takes nothing (RabbitMQ's delivery to a
        # queue process that is gone).
        queues = [q for q in routed.queues if vhost.queues.get(q.name) is q]
        publishing.store(h, vhost, channel, routed._replace(queues=queues))
    # Commit-Ok goes out once the committed publishes and acks are on disk.
    h.reply_durable(channel.id, m.TxCommitOk(), always=True)


def tx_rollback(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    if not channel.transactional:
        raise errors.PreconditionFailed("channel is not transactional", 90, 30)
    channel.restore_held()
    channel.tx_publishes.clear()
    h.conn.send_method(channel.id, m.TxRollbackOk())


def access_request(h: AmqpSession, channel: ChannelSession, method: m.Method) -> None:
    h.conn.send_method(channel.id, m.AccessRequestOk(ticket=1))
