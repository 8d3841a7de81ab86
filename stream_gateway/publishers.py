"""Publishers: DeclarePublisher, DeletePublisher, Publish, PublishConfirm and PublishError.

Owns a connection's publishers (id -> stream and reference) and the publish fast path: a
Publish frame's payload goes whole to the storage side (`StreamQueue.append_publish`, parsed
and deduplicated in C), which returns the frame's publishing ids ready for the confirm;
the stream's sync round is requested as an AMQP publish requests it, and its consumers are
woken after it. Confirms go out once the group commit covers the frame
(`log.durable_next >= next_offset`), one PublishConfirm frame per run of a publisher's
frames in a round. PublishError carries RabbitMQ's codes; it is the only path that parses
publishing ids in Python (a refused frame is rare).
"""

from __future__ import annotations

import logging
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from stream_gateway.codec import commands as c
from stream_gateway.codec.constants import Key, ResponseCode
from stream_gateway.errors import CloseConnection, StreamError
from stream_gateway.streams import stream_queue
from streamq.broker.queue import Queue
from streamq.log.errors import LogError
from streamq.queues import filter_values
from streamq.queues.publishers import BadPublish
from streamq.queues.stream import PublishResult, StreamQueue

if TYPE_CHECKING:
    from stream_gateway.session import StreamSession

logger = logging.getLogger(__name__)

OK: Final = ResponseCode.OK
_CONFIRM_HEAD: Final = struct.Struct(">IHHBi")  # size, key, version, publisher id, count
_ERROR_ENTRY: Final = struct.Struct(">QH")
_ID: Final = struct.Struct(">Q")
CONFIRM_IDS_MAX: Final = 65536  # publishing ids per PublishConfirm frame
PUBLISH_HEAD_BYTES: Final = 5  # key, version, publisher id


@dataclass(slots=True)
class Publisher:
    publisher_id: int
    stream: str
    queue: Queue
    reference: bytes
    # The `AccountStore.generation` its write permission was last granted at: a Publish
    # frame under another generation checks it again (`_write_allowed`).
    generation: int


@dataclass(slots=True)
class PendingConfirm:
    """A Publish frame waiting for the sync round that covers it."""

    next_offset: int
    publisher_id: int
    ids: bytes


def declare(s: StreamSession, m: c.DeclarePublisher) -> None:
    if m.publisher_id in s.publishers:
        raise StreamError(ResponseCode.PRECONDITION_FAILED, "publisher id in use")
    queue, _stream = stream_queue(s, m.stream)
    generation = s.broker.accounts.generation  # read before the check it stands for
    s.check("write", m.stream)
    # Up to the protocol's 32,767 bytes; a long one is stored as its digest (as a
    # filter value is: streamq.queues.filter_values).
    reference = filter_values.stored(m.reference.encode())
    # Within one connection only, as RabbitMQ: a client reconnecting before the broker
    # noticed its old connection died declares the same reference again.
    if reference and any(
        p.queue is queue and p.reference == reference for p in s.publishers.values()
    ):
        raise StreamError(ResponseCode.PRECONDITION_FAILED, "publisher reference in use")
    publisher = Publisher(m.publisher_id, m.stream, queue, reference, generation)
    s.publishers[m.publisher_id] = publisher
    s.gateway.add_publisher(s, publisher)
    s.send(c.Response(Key.DECLARE_PUBLISHER, m.correlation_id, OK))
    if s.gateway.blocks(s):
        s.hold_for_alarm(True)


def delete(s: StreamSession, m: c.DeletePublisher) -> None:
    publisher = s.publishers.pop(m.publisher_id, None)
    if publisher is None:
        raise StreamError(ResponseCode.PUBLISHER_DOES_NOT_EXIST)
    s.gateway.remove_publisher(s, publisher)
    s.send(c.Response(Key.DELETE_PUBLISHER, m.correlation_id, OK))


def query_sequence(s: StreamSession, m: c.QueryPublisherSequence) -> None:
    _queue, stream = stream_queue(s, m.stream)
    s.check("read", m.stream)
    # 0 for a reference that stored nothing, as RabbitMQ (a client resumes from id + 1).
    sequence = max(stream.publishers.sequence(filter_values.stored(m.reference.encode())), 0)
    s.send(c.QueryPublisherSequenceResponse(m.correlation_id, OK, sequence))


def publish(s: StreamSession, frame: bytes, version: int) -> None:
    """Append a Publish frame's messages; confirm them after the next sync round."""
    if len(frame) < PUBLISH_HEAD_BYTES:
        raise CloseConnection(ResponseCode.UNKNOWN_FRAME, "truncated Publish")
    publisher_id = frame[4]
    payload = memoryview(frame)[PUBLISH_HEAD_BYTES:]
    publisher = s.publishers.get(publisher_id)
    if publisher is None:
        send_errors(s, publisher_id, payload, version, ResponseCode.PUBLISHER_DOES_NOT_EXIST)
        return
    if publisher.generation != s.broker.accounts.generation and not _write_allowed(s, publisher):
        send_errors(s, publisher_id, payload, version, ResponseCode.ACCESS_REFUSED)
        return
    queue = publisher.queue
    vhost = s.current_vhost()
    stream = queue.stream
    if stream is None or vhost.queues.get(queue.name) is not queue:
        send_errors(s, publisher_id, payload, version, ResponseCode.STREAM_DOES_NOT_EXIST)
        return
    try:
        result = _append(stream, publisher.reference, version, payload)
    except BadPublish as exc:
        raise CloseConnection(ResponseCode.UNKNOWN_FRAME, f"malformed Publish: {exc}") from None
    except LogError as exc:
        logger.error("stream %s: append failed: %s", queue.name, exc)
        send_errors(s, publisher_id, payload, version, ResponseCode.INTERNAL_ERROR)
        return
    if result.appended:
        queue.stats.publish += result.appended
        vhost.stats.publish += result.count
        vhost.stream_appended(queue)
    pending = s.gateway.pending_confirms(s, queue)
    pending.append(PendingConfirm(result.next_offset, publisher_id, result.ids))
    if stream.log.durable_next >= result.next_offset:
        send_confirms(s, queue, pending, stream.log.durable_next)


def _append(
    stream: StreamQueue, reference: bytes, version: int, payload: memoryview
) -> PublishResult:
    """`append_publish`; a v2 frame with filter values over 255 bytes (up to the
    protocol's 32,767) goes again with their stored forms (`filter_values`). Raises
    BadPublish and the log's errors as `append_publish`."""
    now_ms = int(time.time() * 1000)
    try:
        return stream.append_publish(reference, version, payload, now_ms)
    except BadPublish as exc:
        if version != 2 or filter_values.LONG_FILTER_TEXT not in str(exc):
            raise
    try:
        shortened = filter_values.shorten_publish(payload)
    except ValueError as exc:
        raise BadPublish(str(exc)) from None
    return stream.append_publish(reference, version, shortened, now_ms)


def _write_allowed(s: StreamSession, publisher: Publisher) -> bool:
    """Whether the publisher may still write, asked again after the accounts changed: as
    RabbitMQ 3.10 checks every Publish frame (refused: PublishError ACCESS_REFUSED), at
    the cost of one int compare per frame while nothing changes."""
    accounts = s.broker.accounts
    generation = accounts.generation
    assert s.vhost is not None
    if not accounts.permitted(s.user, s.vhost.name, "write", publisher.stream):
        return False  # the generation stays old: a later grant is seen by the next frame
    publisher.generation = generation
    return True


def send_confirms(
    s: StreamSession, queue: Queue, pending: deque[PendingConfirm], durable_next: int
) -> int:
    """Write the confirms of the frames `durable_next` covers, one frame per run of one
    publisher's frames (at most CONFIRM_IDS_MAX ids each); returns how many ids."""
    out = s.out
    confirmed = 0
    while pending and pending[0].next_offset <= durable_next:
        publisher_id = pending[0].publisher_id
        ids: list[bytes] = []
        count = 0
        while (
            pending
            and pending[0].next_offset <= durable_next
            and pending[0].publisher_id == publisher_id
            and count < CONFIRM_IDS_MAX
        ):
            entry = pending.popleft()
            ids.append(entry.ids)
            count += len(entry.ids) // 8
        body = b"".join(ids)
        out += _CONFIRM_HEAD.pack(9 + len(body), Key.PUBLISH_CONFIRM, 1, publisher_id, count)
        out += body
        confirmed += count
    queue.stats.confirm += confirmed
    return confirmed


def send_errors(
    s: StreamSession, publisher_id: int, payload: memoryview, version: int, code: ResponseCode
) -> None:
    """PublishError with `code` for every message of the frame."""
    ids = publishing_ids(payload, version)
    if ids is None:
        raise CloseConnection(ResponseCode.UNKNOWN_FRAME, "malformed Publish")
    body = b"".join(_ERROR_ENTRY.pack(i, code) for i in ids)
    s.out += _CONFIRM_HEAD.pack(9 + len(body), Key.PUBLISH_ERROR, 1, publisher_id, len(ids))
    s.out += body


def publishing_ids(payload: memoryview, version: int) -> list[int] | None:
    """The publishing ids of a Publish payload (from its message count on), None when
    it does not parse."""
    try:
        (count,) = struct.unpack_from(">i", payload, 0)
        position, ids = 4, []
        for _ in range(count):
            ids.append(_ID.unpack_from(payload, position)[0])
            position += 8
            if version == 2:
                (size,) = struct.unpack_from(">h", payload, position)
                position += 2 + max(size, 0)
            (size,) = struct.unpack_from(">i", payload, position)
            if size < 0:
                return None
            position += 4 + size
    except struct.error:
        return None
    return ids if count >= 0 and position == len(payload) else None
