"""Per-channel AMQP state held by the server: delivery tags, unacked deliveries, prefetch,
consumers, publisher confirms and transactions.

Owns the bookkeeping that the AMQP spec ties to a channel. It holds no sockets and sends
nothing itself: deliveries are encoded into the connection's outgoing buffer, and the
server decides when to write it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, deque
from collections.abc import Iterable
from itertools import repeat, takewhile
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol, cast

from amqp_gateway import codec, errors
from amqp_gateway.codec import methods as m
from amqp_gateway.codec.properties import add_long_header
from amqp_gateway.stream_offsets import StreamFilter
from streamq.broker.queue import Queue
from streamq.log.format import Record
from streamq.queues.classic import ReadyMessage
from streamq.queues.offsets import AckWatermark
from streamq.queues.window import ReadWindow

if TYPE_CHECKING:
    from amqp_gateway.connection import Connection
    from amqp_gateway.events import Publish
    from streamq.broker.stats import MessageStats


class Clock:
    """A coarse clock (monotonic ms) that the server sets once per delivery drain and
    housekeeping tick, so that stamping a delivery costs no clock read."""

    __slots__ = ("now_ms",)

    def __init__(self) -> None:
        self.now_ms = monotonic_ms()


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class Owner(Protocol):
    """The server-side connection that owns the channels."""

    paused: bool  # the socket's write buffer is full: deliver nothing more for now
    clock: Clock
    # Deliveries framed since the outgoing buffer was last written (`flush` zeroes it).
    unflushed: int

    def note_output(self) -> None:
        """Deliveries were encoded into the outgoing buffer: write it soon."""

    def flush(self) -> None:
        """Write the outgoing buffer now."""


class RoutedPublish(NamedTuple):
    """A publish routed, not stored yet: stored at once, or at tx.commit (RabbitMQ 3.10
    routes a transaction's publishes when they come)."""

    publish: Publish
    queues: list[Queue]
    properties_raw: bytes  # as stored (BCC removed, reply-to rewritten)
    reply: bool  # unrouted for `mandatory` and direct reply-to
    routed_later: bool  # held by a LavinMQ-style delayed exchange: counts as routed
    stats: MessageStats  # the exchange's


class Unacked(NamedTuple):
    """A delivery not yet settled. A tuple, so that a run of deliveries builds its
    entries in C (`tuple.__new__` mapped over zipped fields, no Python call each)."""

    queue: Queue
    offset: int
    consumer: GatewayConsumer | None
    delivered_ms: int  # monotonic: the consumer timeout counts from here


_new_tuple = tuple.__new__


_CONSUMER_OF = attrgetter("consumer")
_FIRST = itemgetter(0)
_UNLIMITED: Final = 1 << 30  # the credit of a consumer without a prefetch limit
# Deliveries framed per call of `codec.deliver_records` stop past this much output (at
# least one message), so that a run of large messages is written in steps.
DELIVER_OUT_BYTES_MAX: Final = 1 << 20
# Credit moves in pieces of a quarter of a consumer's prefetch: a run of deliveries is
# written to the socket piece by piece, and a read full of acks is settled piece by piece
# with the deliveries their credit allows in between (`basic_methods.settle_ack_run`). The client
# works on the first piece while the broker frames the next, and acks come back while
# later pieces are in flight. A whole window per write made the broker and the client
# take turns (docs/benchmarks.md, "Draining a deep backlog").
PIECES_PER_WINDOW: Final = 4
PIECE_MIN: Final = 64  # below this a piece's write and drain cost more than the overlap
PIECE_MAX: Final = 4096  # a drain delivers at most this many per queue anyway
# Acks settled between two drains at most, whatever the prefetch (none included): a read
# of acks gives deliveries a turn at least this often, as its slices of 512 events did.
ACK_PIECE_MAX: Final = 512


def piece_of(prefetch: int) -> int:
    """How many deliveries (or acks) make one piece of a window of `prefetch` (0: no
    limit, no pieces)."""
    if prefetch <= 0:
        return _UNLIMITED
    return min(max(prefetch // PIECES_PER_WINDOW, PIECE_MIN), PIECE_MAX)


class ChannelSession:
    """What the server remembers about one open channel."""

    def __init__(self, channel_id: int, connection: Connection, owner: Owner) -> None:
        self.id = channel_id
        self.connection = connection
        self.owner = owner
        self.clock = owner.clock
        self.next_delivery_tag = 1
        self.unacked: dict[int, Unacked] = {}  # by delivery tag, in delivery order
        # Unacked deliveries to consumers: the global prefetch counts these, not basic.get
        # deliveries (RabbitMQ).
        self.consumer_unacked = 0
        self.consumer_prefetch = 0  # basic.qos global=false: applies to new consumers
        self.channel_prefetch = 0  # basic.qos global=true: all consumers together
        # basic.get deliveries unacked when the global prefetch went from 0 to a limit:
        # RabbitMQ's limiter starts from the length of the channel's unacked queue, gets
        # included, and never takes them off (their acks are no consumer's), so they use
        # the channel's credit until the limit goes back to 0 (rabbit_channel, basic.qos).
        self.prefetch_gets = 0
        self.consumers: dict[str, GatewayConsumer] = {}
        self.last_queue: str | None = None  # what an empty queue name means
        self.flow_active = True
        self.confirm = False
        self.publish_seq = 0
        self.confirmed_seq = 0
        self.rejected_seqs: list[int] = []  # publishes a full queue refused: nacked
        self.transactional = False
        self.tx_publishes: list[RoutedPublish] = []
        # Acks, nacks and rejects of the open transaction: (deliveries by tag, ack,
        # requeue). Their deliveries left `unacked` when the method came (a tag named
        # twice is a 406 at once, as in RabbitMQ) but still count for the prefetch.
        self.tx_acks: list[tuple[dict[int, Unacked], bool, bool]] = []
        # Direct reply-to (amqp_gateway.reply_to): the reply consumer's tag and name.
        self.reply_tag: str | None = None
        self.reply_suffix: str | None = None

    def queue_name(self, name: str, ids: tuple[int, int]) -> str:
        """Spec rule: an empty queue name means the queue last declared on the channel."""
        if name:
            return name
        if self.last_queue is None:
            raise errors.NotFound("no previously declared queue", *ids)
        return self.last_queue

    def timed_out(self, default_ms: int, now_ms: int) -> int | None:
        """The consumer timeout that the oldest unacked delivery has outlived, if it has
        (as RabbitMQ, only the oldest is looked at): the consumer's x-consumer-timeout,
        else its queue's, else `default_ms`; 0 means none. None if within its time."""
        if not self.unacked:
            return None
        oldest = next(iter(self.unacked.values()))  # tags are inserted in delivery order
        timeout_ms = None
        if oldest.consumer is not None:
            timeout_ms = oldest.consumer.timeout_ms
        if timeout_ms is None:
            timeout_ms = oldest.queue.consumer_timeout_ms
        if timeout_ms is None:
            timeout_ms = default_ms
        if timeout_ms and now_ms - oldest.delivered_ms >= timeout_ms:
            return timeout_ms
        return None

    def can_deliver(self) -> bool:
        """Flow is on and the global prefetch (if any) has credit: RabbitMQ's limiter
        stops every consumer of the channel at the limit, no_ack ones included."""
        return self.flow_active and (
            self.channel_prefetch == 0
            or self.consumer_unacked + self.prefetch_gets < self.channel_prefetch
        )

    def set_channel_prefetch(self, prefetch_count: int) -> None:
        """basic.qos global=true (see `prefetch_gets`)."""
        if prefetch_count == 0:
            self.prefetch_gets = 0
        elif self.channel_prefetch == 0:
            self.prefetch_gets = sum(1 for entry in self.unacked.values() if entry.consumer is None)
        self.channel_prefetch = prefetch_count

    def ack_piece(self) -> int:
        """How many acks of a run are settled before the deliveries they allow go out
        (`piece_of` the largest credit limit of the channel's consumers, at most
        ACK_PIECE_MAX)."""
        prefetch = self.channel_prefetch
        for consumer in self.consumers.values():
            if not consumer.prefetch:
                prefetch = 0
                break
            prefetch = max(prefetch, consumer.prefetch)
        return min(piece_of(prefetch), ACK_PIECE_MAX)

    def take_tag(self) -> int:
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        return tag

    def settle_tags(self, delivery_tag: int, multiple: bool) -> list[Unacked]:
        """Remove and return the deliveries an ack/nack/reject names, and give their
        consumers the credit back; [] if the tag is unknown (the caller closes the
        channel with 406)."""
        # C-level loops: an ack with `multiple` settles hundreds at once, and the event
        # loop does nothing else meanwhile (per entry in Python it took about 1 us).
        settled = list(map(self.unacked.pop, self._named_tags(delivery_tag, multiple)))
        self.release(settled)
        return settled

    def settle_run(self, tags: list[int]) -> list[Unacked]:
        """`settle_tags` of a run of plain acks (multiple=false), in one step: the
        deliveries of `tags` up to the first unknown one (a tag named twice is unknown the
        second time, as one ack after another finds it), with their consumers' credit
        given back. Fewer deliveries than tags means `tags[len(result)]` is unknown: the
        tags from there stay unacked, for the per-method path to judge one by one."""
        unacked = self.unacked
        # C-level loops (map, the None test): one pop per tag and no Python code per ack.
        settled: list[Unacked | None] = list(map(unacked.pop, tags, repeat(None)))
        if None in settled:
            settled = self._unsettle_after_unknown(tags, settled)
        taken = cast("list[Unacked]", settled)  # no None is left
        self.release(taken)
        return taken

    def _unsettle_after_unknown(
        self, tags: list[int], settled: list[Unacked | None]
    ) -> list[Unacked | None]:
        """The deliveries taken after the first unknown tag go back to `unacked`, in tag
        order (delivery order: tags only grow); returns the ones before it."""
        unknown = settled.index(None)
        back = [
            (tag, entry) for tag, entry in zip(tags, settled, strict=True) if entry is not None
        ][unknown:]
        if back:
            restored = self.unacked
            restored.update(back)
            self.unacked = dict(sorted(restored.items()))
        return settled[:unknown]

    def hold_tags(self, delivery_tag: int, multiple: bool) -> dict[int, Unacked]:
        """`settle_tags` for a transaction: by tag, and the consumers' credit stays
        taken until the commit `release`s it."""
        tags = self._named_tags(delivery_tag, multiple)
        return dict(zip(tags, map(self.unacked.pop, tags), strict=True))

    def _named_tags(self, delivery_tag: int, multiple: bool) -> list[int]:
        unacked = self.unacked
        if multiple:
            if delivery_tag == 0:
                return list(unacked)
            if delivery_tag not in unacked:
                # RabbitMQ's collect_acks looks for the tag itself, multiple or not: one
                # that is not unacked (settled already, or never handed out) is a 406,
                # and nothing before it is settled.
                return []
            # Tags are inserted in increasing order: stop at the first one past it.
            return list(takewhile(delivery_tag.__ge__, unacked))
        return [delivery_tag] if delivery_tag in unacked else []

    def release(self, settled: list[Unacked]) -> None:
        """The consumers of `settled` deliveries may take as many more (prefetch): each
        rejoins its queue's turns if it was parked (`Queue.unblock`); with a global
        prefetch, every consumer of the channel does."""
        consumers = set(map(_CONSUMER_OF, settled))
        if len(consumers) == 1:  # the common case: a set in C, no Counter's Python frames
            [only] = consumers
            if only is not None:
                only.unacked -= len(settled)
                self.consumer_unacked -= len(settled)
                if not self.channel_prefetch:
                    only.queue.unblock(only)
        else:
            for consumer, count in Counter(map(_CONSUMER_OF, settled)).items():
                if consumer is not None:
                    consumer.unacked -= count
                    self.consumer_unacked -= count
        if self.channel_prefetch:
            self.unblock_consumers()
        elif len(consumers) > 1:
            self.unblock_consumers(consumers)

    def unblock_consumers(self, consumers: Iterable[GatewayConsumer | None] = ()) -> None:
        """The channel's consumers (or those of `consumers`) may have credit again (acks,
        flow on, basic.qos, the socket writable, a global prefetch's credit freed): the
        parked ones rejoin their queues' turns in the order they were parked, as
        RabbitMQ's unblock moves a channel's blocked consumers back (`Queue.unblock`).
        The caller kicks the queues."""
        parked = []
        for consumer in consumers or self.consumers.values():
            if consumer is not None:
                at = consumer.queue.parked_at(consumer)
                if at is not None:
                    parked.append((at, consumer))
        parked.sort(key=_FIRST)
        for _, consumer in parked:
            consumer.queue.unblock(consumer)

    def restore_held(self) -> None:
        """tx.rollback, or the channel's end: the deliveries the transaction's acks held
        are unacked again, in tag order (RabbitMQ's rollback sorts them back in)."""
        held = self.tx_acks
        if not held:
            return
        self.tx_acks = []
        restored = dict(self.unacked)
        for deliveries, _, _ in held:
            restored.update(deliveries)
        self.unacked = dict(sorted(restored.items()))


def settle_groups(held: dict[int, Unacked]) -> list[list[Unacked]]:
    """The deliveries of one nack, reject or recover in the groups RabbitMQ's channel
    settles them by (rabbit_channel:foreach_per_queue, keyed {queue, consumer tag}): by
    queue name, then each basic.get delivery alone in tag order (its key is its delivery
    tag, an integer, which Erlang orders before any binary), then each consumer's
    deliveries together, by consumer tag."""
    groups: dict[tuple[str, int, int, bytes], list[Unacked]] = {}
    for tag, entry in held.items():
        consumer = entry.consumer
        if consumer is None:
            key = (entry.queue.name, 0, tag, b"")
        else:
            key = (entry.queue.name, 1, 0, consumer.tag_raw)
        groups.setdefault(key, []).append(entry)
    return [groups[key] for key in sorted(groups)]


class GatewayConsumer:
    """A basic.consume on a channel, as the broker core's Consumer protocol wants it."""

    __slots__ = (
        "channel",
        "exclusive",
        "no_ack",
        "prefetch",
        "priority",
        "queue",
        "stream_filter",
        "stream_position",
        "stream_redeliver",
        "stream_tracker",
        "stream_window",
        "tag",
        "tag_raw",
        "timeout_ms",
        "unacked",
    )

    def __init__(
        self,
        channel: ChannelSession,
        queue: Queue,
        tag: str,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
    ) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.tag_raw = tag.encode()
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.priority = 0
        self.timeout_ms: int | None = None  # x-consumer-timeout on basic.consume
        self.unacked = 0
        self.stream_position = 0
        self.stream_redeliver: deque[int] = deque()
        self.stream_filter: StreamFilter | None = None
        self.stream_tracker: AckWatermark | None = None
        self.stream_window: ReadWindow | None = None  # its place in the stream's log

    @property
    def stream_filtered(self) -> bool:
        return self.stream_filter is not None

    def cancel_by_broker(self) -> None:
        """consumer_cancel_notify: tell the client its queue is gone or failed, if it
        announced that capability; otherwise the consumer just ends, as in RabbitMQ
        (rabbit_channel sends basic.cancel only to clients that asked)."""
        channel = self.channel
        channel.consumers.pop(self.tag, None)
        connection = channel.connection
        if connection.is_channel_open(channel.id) and connection.announces(
            "consumer_cancel_notify"
        ):
            connection.send_method(channel.id, m.BasicCancel(consumer_tag=self.tag, nowait=True))
            channel.owner.note_output()

    def accepts(self, properties_raw: bytes) -> bool:
        return self.stream_filter is None or self.stream_filter.accepts(properties_raw)

    def can_take(self) -> bool:
        if not self.channel.connection.is_channel_open(self.channel.id):
            return False  # see `credit`
        if self.no_ack:
            return self.channel.can_deliver() and not self.channel.owner.paused
        return (
            (self.prefetch == 0 or self.unacked < self.prefetch)
            and self.channel.can_deliver()
            and not self.channel.owner.paused
        )

    def credit(self) -> int:
        channel = self.channel
        if not channel.flow_active or channel.owner.paused:
            return 0
        if not channel.connection.is_channel_open(channel.id):
            # Closed by an error, waiting for the client's close-ok: nothing more goes
            # out after channel.close (the consumer leaves at the close-ok).
            return 0
        if self.no_ack:
            return _UNLIMITED if channel.can_deliver() else 0
        credit = self.prefetch - self.unacked if self.prefetch else _UNLIMITED
        if channel.channel_prefetch:
            held = channel.consumer_unacked + channel.prefetch_gets
            credit = min(credit, channel.channel_prefetch - held)
        return credit

    def deliver(self, queue: Queue, message: ReadyMessage, record: Record) -> None:
        channel = self.channel
        tag = channel.take_tag()
        if not self.no_ack:
            channel.unacked[tag] = Unacked(queue, message.offset, self, channel.clock.now_ms)
            self.unacked += 1
            channel.consumer_unacked += 1
        connection = channel.connection
        properties_raw = record.properties
        if queue.stream is not None:
            queue.stats.deliver += 1  # the vhost counts classic deliveries per batch
            properties_raw = with_long_header(properties_raw, "x-stream-offset", message.offset)
        elif message.delivery_count:
            properties_raw = with_long_header(
                properties_raw, "x-delivery-count", message.delivery_count
            )
        codec.encode_deliver(
            connection.outgoing,
            codec.ChannelId(channel.id),
            self.tag_raw,
            codec.DeliveryTag(tag),
            message.redelivered,
            record.exchange,
            record.routing_key,
            properties_raw,
            record.body,
            connection.frame_max,
        )
        channel.owner.note_output()

    def deliver_records(
        self,
        queue: Queue,
        records: bytes | bytearray | memoryview,
        position: int,
        first: int,
        count: int,
    ) -> tuple[int, int, int, list[int]]:
        channel = self.channel
        tag = channel.next_delivery_tag
        connection = channel.connection
        owner = channel.owner
        piece = self.piece()
        result = codec.deliver_records(
            connection.outgoing,
            records,
            position,
            first,
            min(count, max(piece - owner.unflushed, 1)),
            channel.id,
            self.tag_raw,
            tag,
            connection.frame_max,
            DELIVER_OUT_BYTES_MAX,
        )
        self._sent_run(queue, first, tag, result[0])
        self._end_piece(owner, result[0], piece)
        return result

    def piece(self) -> int:
        """How many deliveries go out per socket write (`piece_of` its credit limit)."""
        return piece_of(self.prefetch or self.channel.channel_prefetch)

    def _end_piece(self, owner: Owner, delivered: int, piece: int) -> None:
        """Write what is framed once a piece is complete: the caller frames the rest of
        its run after it (`delivery.deliver_run` calls again for what is left)."""
        owner.unflushed += delivered
        if owner.unflushed >= piece:
            owner.flush()

    def _sent_run(self, queue: Queue, first: int, tag: int, delivered: int) -> None:
        """`delivered` deliveries of the offsets from `first` on went out with the tags
        from `tag` on: take the tags, and unless no-ack register them as unacked, their
        entries built in C (`tuple.__new__` mapped over zipped fields)."""
        if not delivered:
            return
        channel = self.channel
        channel.next_delivery_tag = tag + delivered
        if not self.no_ack:
            now_ms = channel.clock.now_ms
            fields = zip(
                repeat(queue), range(first, first + delivered), repeat(self), repeat(now_ms)
            )
            entries = map(_new_tuple, repeat(Unacked), fields)
            channel.unacked.update(zip(range(tag, tag + delivered), entries, strict=True))
            self.unacked += delivered
            channel.consumer_unacked += delivered
        channel.owner.note_output()

    def deliver_stream_records(
        self,
        queue: Queue,
        records: bytes | bytearray | memoryview,
        position: int,
        first: int,
        count: int,
    ) -> tuple[int, int, int, bool]:
        """`deliver_records` for a stream: the deliveries carry `x-stream-offset` (as
        `deliver` adds it), stream clients' native records converted in C as
        `amqp10.as_amqp091` converts them, and a record the C splice leaves to the
        per-record path stops the run before it (`stopped`). Counts the deliveries in
        the queue's stats."""
        channel = self.channel
        tag = channel.next_delivery_tag
        connection = channel.connection
        owner = channel.owner
        piece = self.piece()
        result = codec.deliver_stream_records(
            connection.outgoing,
            records,
            position,
            first,
            min(count, max(piece - owner.unflushed, 1)),
            channel.id,
            self.tag_raw,
            tag,
            connection.frame_max,
            DELIVER_OUT_BYTES_MAX,
            queue.name.encode("utf-8", "surrogateescape"),  # native records convert in C
        )
        self._sent_run(queue, first, tag, result[0])
        queue.stats.deliver += result[0]
        self._end_piece(owner, result[0], piece)
        return result


def with_long_header(properties_raw: bytes, name: str, value: int) -> bytes:
    """The properties with the header `name` set to the long `value`: spliced in when the
    message does not carry it yet (the common case), else replaced by decode and encode.
    Deliveries from a stream carry `x-stream-offset` (as RabbitMQ and LavinMQ add it);
    redeliveries carry `x-delivery-count`, the deliveries before this one, which survives
    restarts with the queue journal."""
    if name.encode() not in properties_raw:
        return add_long_header(properties_raw, name, value)
    properties = codec.decode_properties(properties_raw)
    headers = dict(properties.headers or {})
    headers[name] = codec.Int64(value)
    return codec.encode_properties(dataclasses.replace(properties, headers=headers))
