"""Stream commands: Create, Delete, Metadata, StreamStats, StoreOffset and QueryOffset.

Owns what the stream protocol does to streams as entities: creating one as an AMQP client
declares an `x-queue-type: stream` queue (policies apply; the response goes out once the
declaration is durable), deleting one (its AMQP consumers are cancelled and the stream
clients that use it get MetadataUpdate), this node as every stream's leader in Metadata,
the in-sync followers as replicas,
RabbitMQ's StreamStats, and the consumer offsets stored on the broker: the same
`StreamQueue.offsets` as the AMQP side's tracked offsets, under the reference as the AMQP
side's consumer tag, both meaning "the last offset processed".
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, ResponseCode
from stream_gateway.errors import StreamError
from streamq.broker import stream_definitions
from streamq.broker.queue import Queue
from streamq.log.errors import LogError
from streamq.queues.stream import StreamQueue

if TYPE_CHECKING:
    from stream_gateway.session import StreamSession

logger = logging.getLogger(__name__)

OK: Final = ResponseCode.OK
NO_LEADER: Final = 0xFFFF  # RabbitMQ's leader reference for a stream in error
METADATA_STREAMS_MAX: Final = 1024


def stream_queue(s: StreamSession, name: str) -> tuple[Queue, StreamQueue]:
    """The stream `name` of the connection's vhost. Raises StreamError:
    STREAM_DOES_NOT_EXIST, or STREAM_NOT_AVAILABLE for a failed stream."""
    queue = s.current_vhost().queues.get(name)
    if queue is None or not stream_definitions.is_stream(s.current_vhost(), name):
        raise StreamError(ResponseCode.STREAM_DOES_NOT_EXIST, f"no stream {name!r}")
    if queue.stream is None or queue.failed is not None:
        raise StreamError(ResponseCode.STREAM_NOT_AVAILABLE, f"stream {name!r} failed")
    return queue, queue.stream


def reply_after_sync(s: StreamSession, response: c.Command) -> None:
    """Send `response` once the vhost's definitions are durable (a sync round)."""
    vhost = s.current_vhost()

    async def reply() -> None:
        try:
            await vhost.sync_all()
        except LogError as exc:
            logger.error("stream %s: definitions not durable: %s", s.peer, exc)
            s.close_with(ResponseCode.INTERNAL_ERROR, "the message store failed")
            return
        s.send(response)
        s.flush()

    asyncio.get_running_loop().create_task(reply())


def create(s: StreamSession, m: c.Create) -> None:
    vhost = s.current_vhost()
    if stream_definitions.is_stream(vhost, m.stream):
        raise StreamError(ResponseCode.STREAM_ALREADY_EXISTS)
    if not m.stream or len(m.stream.encode()) > 255:
        raise StreamError(ResponseCode.PRECONDITION_FAILED, "invalid stream name")
    s.check("configure", m.stream)
    arguments = stream_definitions.stream_arguments(m.arguments)
    stream_definitions.declare_stream(vhost, m.stream, arguments)
    reply_after_sync(s, c.Response(Key.CREATE, m.correlation_id, OK))


def delete(s: StreamSession, m: c.Delete) -> None:
    vhost = s.current_vhost()
    if not stream_definitions.is_stream(vhost, m.stream):
        raise StreamError(ResponseCode.STREAM_DOES_NOT_EXIST)
    s.check("configure", m.stream)
    remove_stream(s, m.stream)
    reply_after_sync(s, c.Response(Key.DELETE, m.correlation_id, OK))


def remove_stream(s: StreamSession, name: str) -> None:
    """Delete the stream, cancelling its AMQP consumers (the HTTP API's way)."""
    vhost = s.current_vhost()
    queue = vhost.queues[name]
    consumers = list(queue.consumers)
    vhost.delete_queue(name, False, False, queue.exclusive_owner)
    for consumer in consumers:
        consumer.cancel_by_broker()


def replica_brokers(s: StreamSession) -> tuple[c.Broker, ...]:
    """The in-sync followers that serve stream reads (docs/clustering.md), as brokers
    1, 2, ...: those in the ISR, following the live stream, with a stream port."""
    cluster = s.broker.cluster
    if cluster is None:
        return ()
    brokers: list[c.Broker] = []
    for row in cluster.nodes():
        if row.is_self or not row.in_isr or row.state != "streaming":
            continue
        host, _, port = row.stream_advertised.rpartition(":")
        if host and port.isdigit():
            brokers.append(c.Broker(len(brokers) + 1, host.strip("[]"), int(port)))
    return tuple(brokers)


def metadata(s: StreamSession, m: c.Metadata) -> None:
    """This node leads every stream: broker 0 is its advertised address; in a cluster,
    the in-sync followers with a stream port are every stream's replicas, as RabbitMQ
    lists a stream's members (its clients read from a replica when there is one)."""
    host, port = s.gateway.advertised(s)
    replicas = replica_brokers(s)
    brokers = (c.Broker(0, host, port), *replicas)
    references = tuple(broker.reference for broker in replicas)
    vhost = s.current_vhost()
    entries = []
    for name in m.streams[:METADATA_STREAMS_MAX]:
        queue = vhost.queues.get(name)
        if queue is None or not stream_definitions.is_stream(vhost, name):
            entries.append(c.StreamMetadata(name, ResponseCode.STREAM_DOES_NOT_EXIST, NO_LEADER))
        elif queue.stream is None or queue.failed is not None:
            entries.append(c.StreamMetadata(name, ResponseCode.STREAM_NOT_AVAILABLE, NO_LEADER))
        else:
            entries.append(c.StreamMetadata(name, OK, 0, references))
    s.send(c.MetadataResponse(m.correlation_id, brokers, tuple(entries)))


def stream_stats(s: StreamSession, m: c.StreamStats) -> None:
    """RabbitMQ's statistics: the first chunk's id and the committed (= last) chunk's
    id, a chunk's id being its first offset; -1 while the stream is empty. A chunk here
    is a sync round's records, as for the "last" offset specification."""
    queue, stream = stream_queue(s, m.stream)
    s.check("read", m.stream)
    log = stream.log
    empty = log.durable_next <= log.start_offset
    first = -1 if empty else log.start_offset
    committed = -1 if empty else s.gateway.last_chunk_start(queue)
    stats = {
        "first_chunk_id": first,
        "committed_chunk_id": committed,
        "last_chunk_id": committed,
    }
    s.send(c.StreamStatsResponse(m.correlation_id, OK, stats))


def store_offset(s: StreamSession, m: c.StoreOffset) -> None:
    """Store `offset` for the reference (fire and forget, as RabbitMQ: a refused store
    is dropped). Durable with the stream's next sync round, which the store starts
    within `offsets.STORE_SYNC_DELAY_S` if the stream's appends do not start one first."""
    try:
        _queue, stream = stream_queue(s, m.stream)
        s.check("read", m.stream)
    except StreamError as exc:
        logger.info("stream %s: StoreOffset on %s refused: %s", s.peer, m.stream, exc)
        return
    if not m.reference or len(m.reference.encode()) > 255:
        return
    stream.offsets.store(m.reference, m.offset)


def query_offset(s: StreamSession, m: c.QueryOffset) -> None:
    _queue, stream = stream_queue(s, m.stream)
    s.check("read", m.stream)
    stored = stream.offsets.get(m.reference)
    if stored is None:
        raise StreamError(ResponseCode.NO_OFFSET)
    s.send(c.QueryOffsetResponse(m.correlation_id, OK, stored))
