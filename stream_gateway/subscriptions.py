"""Subscriptions: Subscribe, Credit, Unsubscribe, Deliver and the ConsumerUpdate answer.

Owns a connection's subscriptions and their delivery: each reads chunks from its position
(`StreamQueue.read_chunk`, built from the segment files) while it has credit (one credit is
one chunk, as RabbitMQ counts it) and its transport's write buffer is under its high
mark, so a consumer that grants no credit costs nothing but its subscription. Offset
specifications have RabbitMQ's meanings through `StreamQueue.start_offset` (the AMQP
side's `x-stream-offset`). Filtering (`filter.N`, `match-unfiltered`) is done by the
storage side per record. Deliver v2 (with the committed offset) goes only to a client
that said it reads it in ExchangeCommandVersions; everyone else gets v1.
"""

from __future__ import annotations

import asyncio
import os
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from stream_gateway import sac
from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import (
    SUBSCRIPTION_PROPERTY_FILTER_PREFIX,
    SUBSCRIPTION_PROPERTY_MATCH_UNFILTERED,
    SUBSCRIPTION_PROPERTY_NAME,
    SUBSCRIPTION_PROPERTY_SINGLE_ACTIVE_CONSUMER,
    Key,
    OffsetType,
    ResponseCode,
)
from stream_gateway.errors import StreamError
from stream_gateway.streams import stream_queue
from streamq.broker.queue import Queue
from streamq.queues import filter_values
from streamq.queues.chunks import CHUNK_HEADER_BYTES, Chunk, ChunkFilter
from streamq.queues.stream import StreamQueue, StreamStart

if TYPE_CHECKING:
    from stream_gateway.session import StreamSession

OK: Final = ResponseCode.OK
CHUNK_RECORDS_MAX: Final = 8192  # records per chunk we build
CHUNKS_PER_DRAIN_MAX: Final = 16  # per subscription per turn: others get their turn
CREDIT_MAX: Final = 1 << 20  # outstanding credit is capped here
DELIVER_HEAD_BYTES: Final = 4 + 2 + 2 + 1 + 8  # size, key, version, id, committed offset
SUPER_STREAM_PROPERTY: Final = "super-stream"
_DELIVER_V1: Final = struct.Struct(">IHHB")
_DELIVER_V2: Final = struct.Struct(">IHHBQ")


class SendfileCount:
    """Chunk bytes sent by os.sendfile since start, process-wide (the tests read it)."""

    bytes = 0


@dataclass(eq=False, slots=True)
class Subscription:
    session: StreamSession
    subscription_id: int
    stream_name: str
    queue: Queue
    stream: StreamQueue
    offset: int  # the next offset to read
    credit: int
    start: c.OffsetSpec
    filter: ChunkFilter | None = None
    group: tuple[str, str, str] | None = None  # SAC: (vhost, stream, name)
    super_stream: str = ""
    active: bool = True  # SAC: only the active one is delivered to
    awaiting_update: bool = False  # SAC: active, waiting for the client's offset
    properties: dict[str, str] = field(default_factory=dict)


def start_offset(s: StreamSession, queue: Queue, spec: c.OffsetSpec) -> int:
    """Where a subscription with `spec` starts reading (RabbitMQ's meanings: "last" is
    the last chunk, `StreamGateway.last_chunk_start`)."""
    stream = queue.stream
    assert stream is not None
    kind = spec.offset_type
    value = spec.value or 0
    if kind == OffsetType.FIRST:
        return stream.start_offset(StreamStart("first"))
    if kind == OffsetType.LAST:
        return s.gateway.last_chunk_start(queue)
    if kind == OffsetType.OFFSET:
        return stream.start_offset(StreamStart("offset", value))
    if kind == OffsetType.TIMESTAMP:
        return stream.start_offset(StreamStart("time", value))
    return stream.start_offset(StreamStart("next"))


def chunk_filter(properties: dict[str, str]) -> ChunkFilter | None:
    """The subscription's filter: its `filter.N` values, a long one (over 255 bytes, up
    to the protocol's limit) also in the form a stream client's record stores it."""
    values = frozenset(
        form
        for k, v in properties.items()
        if k.startswith(SUBSCRIPTION_PROPERTY_FILTER_PREFIX)
        for form in filter_values.forms(v.encode())
    )
    if not values:
        return None
    match_unfiltered = properties.get(SUBSCRIPTION_PROPERTY_MATCH_UNFILTERED, "false") == "true"
    return ChunkFilter(values, match_unfiltered)


def subscribe(s: StreamSession, m: c.Subscribe) -> None:
    if m.subscription_id in s.subscriptions:
        raise StreamError(ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS)
    queue, stream = stream_queue(s, m.stream)
    s.check("read", m.stream)
    properties = dict(m.properties)
    group = None
    if properties.get(SUBSCRIPTION_PROPERTY_SINGLE_ACTIVE_CONSUMER, "false") == "true":
        name = properties.get(SUBSCRIPTION_PROPERTY_NAME, "")
        if not name:
            raise StreamError(
                ResponseCode.PRECONDITION_FAILED, "single active consumer needs a name"
            )
        group = (s.current_vhost().name, m.stream, name)
    subscription = Subscription(
        s, m.subscription_id, m.stream, queue, stream, start_offset(s, queue, m.offset_spec),
        min(m.credit, CREDIT_MAX), m.offset_spec, chunk_filter(properties), group,
        properties.get(SUPER_STREAM_PROPERTY, ""), properties=properties,
    )  # fmt: skip
    s.subscriptions[m.subscription_id] = subscription
    s.gateway.add_reader(subscription)
    s.send(c.Response(Key.SUBSCRIBE, m.correlation_id, OK))
    if group is not None:
        subscription.active = False
        s.gateway.sac.join(subscription)
    s.gateway.drain(subscription)


def unsubscribe(s: StreamSession, m: c.Unsubscribe) -> None:
    subscription = s.subscriptions.get(m.subscription_id)
    if subscription is None:
        raise StreamError(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST)
    remove(subscription)
    s.send(c.Response(Key.UNSUBSCRIBE, m.correlation_id, OK))


def remove(subscription: Subscription) -> None:
    """Forget the subscription (unsubscribed, its connection or stream gone)."""
    s = subscription.session
    s.subscriptions.pop(subscription.subscription_id, None)
    s.gateway.remove_reader(subscription)
    if subscription.group is not None:
        s.gateway.sac.leave(subscription)


def credit(s: StreamSession, m: c.Credit) -> None:
    subscription = s.subscriptions.get(m.subscription_id)
    if subscription is None:
        raise StreamError(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST)
    subscription.credit = min(subscription.credit + m.credit, CREDIT_MAX)
    s.gateway.drain(subscription)


def consumer_update_response(s: StreamSession, m: c.ConsumerUpdateResponse) -> None:
    """The client's answer to ConsumerUpdate: where the newly active consumer starts
    (NONE: where its Subscribe said)."""
    subscription = s.gateway.sac.answered(s, m.correlation_id)
    if subscription is None or not subscription.active:
        return
    spec = m.offset_spec if m.offset_spec.offset_type != OffsetType.NONE else subscription.start
    subscription.offset = start_offset(s, subscription.queue, spec)
    subscription.awaiting_update = False
    s.gateway.drain(subscription)


def drain(subscription: Subscription) -> bool:
    """Deliver chunks while the subscription has credit and its transport room; returns
    True if it stopped at CHUNKS_PER_DRAIN_MAX with more to send."""
    s = subscription.session
    if not subscription.active or subscription.awaiting_update or subscription.credit <= 0:
        return False
    transport = s.transport
    if transport is None or transport.is_closing() or s.write_paused:
        return False
    stream = subscription.stream
    bytes_max = s.frame_max - DELIVER_HEAD_BYTES - CHUNK_HEADER_BYTES
    delivered = 0
    sent = 0
    while subscription.credit > 0 and not s.write_paused:
        if sent >= CHUNKS_PER_DRAIN_MAX:
            _account(subscription, delivered)
            return True
        chunk = stream.read_chunk(
            subscription.offset, CHUNK_RECORDS_MAX, bytes_max, subscription.filter
        )
        if chunk is None:
            break
        subscription.offset = chunk.next_offset
        if not chunk.records:
            continue  # a run the filter passed over
        s.flush()  # what was queued before goes first
        head = _deliver_head(s, subscription, len(chunk.data))
        if chunk.file is None or s.socket_fd < 0 or transport.get_write_buffer_size():
            transport.writelines([head, chunk.data])
        else:
            _send_file(s.socket_fd, transport, head, chunk)
        s.send_oct += len(chunk.data) + DELIVER_HEAD_BYTES
        subscription.credit -= 1
        delivered += chunk.records
        sent += 1
    _account(subscription, delivered)
    return False


def _send_file(socket_fd: int, transport: asyncio.Transport, head: bytes, chunk: Chunk) -> None:
    """Write a Deliver straight to the socket (its transport's buffer is empty, so the
    bytes stay in order): the head, then the chunk by `os.sendfile` from the segment
    file; what the socket does not take now goes through the transport (a copy)."""
    assert chunk.file is not None
    fd, position, length = chunk.file
    try:
        written = os.write(socket_fd, head)
    except (BlockingIOError, InterruptedError):
        written = 0
    if written < len(head):
        transport.writelines([head[written:], chunk.data])
        return
    sent = 0
    try:
        while sent < length:
            step = os.sendfile(socket_fd, fd, position + sent, length - sent)
            if step == 0:
                break
            sent += step
    except (BlockingIOError, InterruptedError):
        pass
    SendfileCount.bytes += sent
    if sent < length:
        transport.write(memoryview(chunk.data)[sent:])


def _deliver_head(s: StreamSession, subscription: Subscription, size: int) -> bytes:
    if s.deliver_v2:
        committed = max(subscription.stream.log.durable_next - 1, 0)
        return _DELIVER_V2.pack(size + 13, Key.DELIVER, 2, subscription.subscription_id, committed)
    return _DELIVER_V1.pack(size + 5, Key.DELIVER, 1, subscription.subscription_id)


def _account(subscription: Subscription, delivered: int) -> None:
    if delivered:
        subscription.queue.stats.deliver_no_ack += delivered


__all__ = ["Subscription", "drain", "remove", "sac"]
