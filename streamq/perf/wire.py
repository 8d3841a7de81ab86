"""The load generator's hot path: receive buffers, pre-encoded publishes, bulk scans.

Owns the bytes that every message costs the client (STYLE.md section 11):
- `RecvBuffer`, one preallocated buffer per socket that `recv_into` fills, so a read of
  hundreds of deliveries costs one system call and no allocation;
- `PublishBatch`, a basic.publish method, header and body frame triple encoded once by
  the project's codec and repeated to fill one socket write, with optional send-time
  stamps in the first 8 body bytes;
- `scan_deliveries`, a hand-rolled frame walk that counts basic.deliver frames and picks
  out delivery tags and stamps without building a frame object per message (the codec's
  general `split_frames` builds one per frame, which would cap the consumer);
- `ConfirmTracker`, publisher confirms settled by basic.ack / basic.nack;
- `AckBatch`, a consumer's per-message acks (one basic.ack frame, multiple=false, per
  delivery tag) for a run of consecutive tags, encoded in a few C-level calls.

It does no socket reads of its own beyond `RecvBuffer.fill`, no clock reads except the
stamps the caller asks for, and knows nothing about processes or reporting.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from array import array
from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec.methods import BasicPublish
from amqp_gateway.errors import FrameError
from streamq.perf.errors import PerfError

RECV_BUFFER_BYTES: Final = 1 << 20
"""The receive buffer: large enough that one read takes everything the kernel holds."""
RECV_FREE_BYTES_MIN: Final = 64 << 10
"""Compact the buffer before a read when less than this is free at its end."""
PUBLISH_BATCH_BYTES_MAX: Final = 256 << 10
"""One socket write of publishes; bigger writes gain nothing on loopback."""
STAMP_BYTES: Final = 8
CHANNEL: Final = codec.ChannelId(1)
"""Every perf connection does its work on channel 1."""

_ENVELOPE = struct.Struct(">BHI")
_IDS = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ENVELOPE_BYTES: Final = 7
_DELIVER_IDS: Final = 60 << 16 | 60
_BASIC_ACK_IDS: Final = 60 << 16 | 80
_BASIC_NACK_IDS: Final = 60 << 16 | 120
_PUBLISH_IDS: Final = 60 << 16 | 40
_SETTLE_IDS: Final = frozenset((_BASIC_ACK_IDS, _BASIC_NACK_IDS))
_BODY_PATTERN_MODULUS: Final = 27
ACK_RUN_COUNT_MAX: Final = 4096
"""basic.ack frames `AckBatch` encodes per pass; a longer run of tags takes several."""
_TAG_BYTES: Final = 8
_ACK_TAG_OFFSET: Final = _ENVELOPE_BYTES + 4
"""Where the delivery tag starts in a basic.ack frame: after the envelope and the ids."""


class RecvBuffer:
    """Bytes received on one socket and not yet parsed: `data[start:end]`."""

    def __init__(self, frame_max: int) -> None:
        self.data = bytearray(max(RECV_BUFFER_BYTES, 2 * frame_max))
        self.view = memoryview(self.data)
        self.start = 0
        self.end = 0
        self.frame_max = frame_max

    def pending(self) -> int:
        return self.end - self.start

    def fill(self, sock: socket.socket) -> int:
        """Read once from `sock` (blocking up to its timeout). Raises `PerfError` when the
        peer has closed the socket, `TimeoutError` when nothing arrived in time."""
        if len(self.data) - self.end < RECV_FREE_BYTES_MIN:
            self._compact()
        received = sock.recv_into(self.view[self.end :])
        if received == 0:
            raise PerfError("the broker closed the connection")
        self.end += received
        return received

    def _compact(self) -> None:
        rest = self.end - self.start
        self.data[:rest] = self.data[self.start : self.end]
        self.start = 0
        self.end = rest

    def split(self) -> list[codec.Frame]:
        """Take every complete frame, through the codec. Raises `FrameError` (501)."""
        frames, used = codec.split_frames(self.view[self.start : self.end], self.frame_max)
        self.start += used
        return frames


def body_bytes(size: int) -> bytes:
    """The message body of `size` bytes, lavinmqperf's pattern of letters."""
    return bytes(i % _BODY_PATTERN_MODULUS + 64 for i in range(size))


class PublishBatch:
    """`count_max` identical publishes, encoded once; `take(n)` hands out the first n."""

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        body_size: int,
        properties_raw: bytes,
        frame_max: int,
        *,
        stamped: bool,
    ) -> None:
        message = bytearray()
        publish = BasicPublish(exchange=exchange, routing_key=routing_key)
        body = body_bytes(body_size)
        codec.append_content_frames(message, CHANNEL, publish, properties_raw, body, frame_max)
        self.message_bytes = len(message)
        # The first body frame's payload starts after the method and header frames.
        body_start = len(message) - _body_frames_bytes(body_size, frame_max) + _ENVELOPE_BYTES
        self.count_max = max(1, PUBLISH_BATCH_BYTES_MAX // self.message_bytes)
        self.data = bytearray(message * self.count_max)
        self.view = memoryview(self.data)
        self.stamp_positions = (
            range(body_start, len(self.data), self.message_bytes) if stamped else range(0)
        )

    def take(self, count: int) -> memoryview:
        """The first `count` publishes, stamped now when stamps were asked for."""
        assert 0 < count <= self.count_max, "count outside the batch"
        end = count * self.message_bytes
        if self.stamp_positions:
            stamp = time.time_ns()
            pack = _U64.pack_into
            data = self.data
            for position in self.stamp_positions:
                if position >= end:
                    break
                pack(data, position, stamp)
        return self.view[:end]


def _body_frames_bytes(body_size: int, frame_max: int) -> int:
    piece_max = frame_max - codec.FRAME_OVERHEAD_BYTES
    frames = -(-body_size // piece_max)
    return body_size + frames * codec.FRAME_OVERHEAD_BYTES


class DeliveryScan:
    """What `scan_deliveries` found in one buffer: counts, tags, stamps, other frames."""

    __slots__ = ("count", "first_tag", "last_tag", "others", "stamps")

    def __init__(self) -> None:
        self.count = 0
        self.first_tag = 0
        self.last_tag = 0
        self.stamps: list[int] = []
        self.others: list[codec.Frame] = []


def scan_deliveries(buffer: RecvBuffer, *, stamped: bool) -> DeliveryScan:
    """Walk every complete frame in `buffer`, counting basic.deliver methods.

    Frames other than deliveries, their headers and bodies (e.g. channel.close,
    tx.commit-ok) are returned in `others` for the codec to decode. With `stamped`, the
    first 8 bytes of each message's first body frame are collected as stamps. Raises
    `FrameError` (501) for a frame over frame_max or a missing frame-end octet.
    """
    # Hot path: one loop with unpack_from over the whole buffer; no object per frame.
    scan = DeliveryScan()
    data = buffer.data
    position = buffer.start
    end = buffer.end
    payload_max = buffer.frame_max - codec.FRAME_OVERHEAD_BYTES
    envelope = _ENVELOPE.unpack_from
    ids = _IDS.unpack_from
    u64 = _U64.unpack_from
    stamps = scan.stamps
    count = 0
    first_tag = last_tag = 0
    first_body = False
    while end - position >= _ENVELOPE_BYTES:
        frame_type, channel, size = envelope(data, position)
        if size > payload_max:
            raise FrameError(f"frame of {size} payload bytes exceeds frame_max")
        frame_end = position + _ENVELOPE_BYTES + size
        if frame_end >= end:
            break
        if data[frame_end] != codec.FRAME_END:
            raise FrameError("missing frame-end octet")
        payload = position + _ENVELOPE_BYTES
        if frame_type == codec.FRAME_BODY:
            if first_body and stamped and size >= STAMP_BYTES:
                stamps.append(u64(data, payload)[0])
            first_body = False
        elif frame_type == codec.FRAME_HEADER:
            first_body = True
        elif frame_type == codec.FRAME_METHOD and ids(data, payload)[0] == _DELIVER_IDS:
            last_tag = u64(data, payload + 5 + data[payload + 4])[0]
            if not count:
                first_tag = last_tag
            count += 1
        elif frame_type != codec.FRAME_HEARTBEAT:
            raw = bytes(data[payload:frame_end])
            scan.others.append(codec.Frame(frame_type, codec.ChannelId(channel), raw))
        position = frame_end + 1
    buffer.start = position
    scan.count = count
    scan.first_tag = first_tag
    scan.last_tag = last_tag
    return scan


class ConfirmTracker:
    """Publisher confirms on one channel: tags settled by basic.ack or basic.nack.

    The broker settles tags in any order and may cover many with `multiple`; tags above
    the contiguous prefix wait in a set until the prefix reaches them.
    """

    def __init__(self) -> None:
        self.settled_upto = 0
        self.nacked = 0
        self._above: set[int] = set()

    def settled(self) -> int:
        return self.settled_upto + len(self._above)

    def settle(self, delivery_tag: int, *, multiple: bool, nack: bool) -> None:
        if multiple:
            if nack:
                self.nacked += max(0, delivery_tag - self.settled())
            if delivery_tag > self.settled_upto:
                self.settled_upto = delivery_tag
                self._above = {tag for tag in self._above if tag > delivery_tag}
        elif delivery_tag > self.settled_upto:
            self.nacked += nack
            self._above.add(delivery_tag)
        while self.settled_upto + 1 in self._above:
            self.settled_upto += 1
            self._above.discard(self.settled_upto)

    def take_frames(self, frames: list[codec.Frame]) -> list[codec.Frame]:
        """Settle the basic.ack and basic.nack frames; return the others."""
        others = []
        for frame in frames:
            is_method = frame.frame_type == codec.FRAME_METHOD and len(frame.payload) >= 4
            key = _IDS.unpack_from(frame.payload)[0] if is_method else 0
            if key in _SETTLE_IDS:
                delivery_tag, bits = struct.unpack_from(">QB", frame.payload, 4)
                self.settle(delivery_tag, multiple=bool(bits & 1), nack=key == _BASIC_NACK_IDS)
            elif frame.frame_type != codec.FRAME_HEARTBEAT:
                others.append(frame)
        return others


def scan_frames(frames: list[codec.Frame], *, stamped: bool) -> DeliveryScan:
    """`scan_deliveries` over frames already split by the codec (the few a set-up call
    read past its reply)."""
    scan = DeliveryScan()
    first_body = False
    for frame in frames:
        payload = frame.payload
        if frame.frame_type == codec.FRAME_BODY:
            if first_body and stamped and len(payload) >= STAMP_BYTES:
                scan.stamps.append(_U64.unpack_from(payload)[0])
            first_body = False
        elif frame.frame_type == codec.FRAME_HEADER:
            first_body = True
        elif frame.frame_type == codec.FRAME_METHOD and payload[:4] == b"\x00\x3c\x00\x3c":
            scan.last_tag = _U64.unpack_from(payload, 5 + payload[4])[0]
            scan.first_tag = scan.first_tag or scan.last_tag
            scan.count += 1
        elif frame.frame_type != codec.FRAME_HEARTBEAT:
            scan.others.append(frame)
    return scan


class PublishScan:
    """What `scan_publishes` found: publishes per channel, the highest tag a consumer's
    basic.ack named per channel, and the other method frames."""

    __slots__ = ("acked_upto", "others", "publishes")

    def __init__(self) -> None:
        self.publishes: dict[int, int] = {}
        self.acked_upto: dict[int, int] = {}
        self.others: list[codec.Frame] = []


def scan_publishes(buffer: RecvBuffer) -> PublishScan:
    """The sink's side of `scan_deliveries`: count basic.publish methods per channel,
    note the highest delivery tag that basic.ack frames name per channel (a read of
    per-message acks is settled at once), and return every other method frame; content
    frames are skipped unread. Raises `FrameError` (501) as `scan_deliveries`."""
    # Hot path of the sink: the same single loop over the buffer, no object per frame.
    scan = PublishScan()
    publishes = scan.publishes
    acked_upto = scan.acked_upto
    u64 = _U64.unpack_from
    data = buffer.data
    position = buffer.start
    end = buffer.end
    payload_max = buffer.frame_max - codec.FRAME_OVERHEAD_BYTES
    envelope = _ENVELOPE.unpack_from
    ids = _IDS.unpack_from
    while end - position >= _ENVELOPE_BYTES:
        frame_type, channel, size = envelope(data, position)
        if size > payload_max:
            raise FrameError(f"frame of {size} payload bytes exceeds frame_max")
        frame_end = position + _ENVELOPE_BYTES + size
        if frame_end >= end:
            break
        if data[frame_end] != codec.FRAME_END:
            raise FrameError("missing frame-end octet")
        if frame_type == codec.FRAME_METHOD:
            payload = position + _ENVELOPE_BYTES
            method_ids = ids(data, payload)[0] if size >= 4 else 0
            if method_ids == _PUBLISH_IDS:
                publishes[channel] = publishes.get(channel, 0) + 1
            elif method_ids == _BASIC_ACK_IDS and size >= 12:
                tag = u64(data, payload + 4)[0]
                acked_upto[channel] = max(acked_upto.get(channel, 0), tag)
            else:
                raw = bytes(data[payload:frame_end])
                scan.others.append(codec.Frame(frame_type, codec.ChannelId(channel), raw))
        position = frame_end + 1
    buffer.start = position
    return scan


class DeliveryBatch:
    """The sink's deliveries to one consumer: basic.deliver, header and body, encoded
    once; `take(n, first_tag)` writes n consecutive delivery tags and a stamp."""

    def __init__(
        self, channel: int, consumer_tag: str, routing_key: str, body_size: int, frame_max: int
    ) -> None:
        message = bytearray()
        codec.encode_deliver(
            message,
            codec.ChannelId(channel),
            consumer_tag,
            codec.DeliveryTag(0),
            False,
            "",
            routing_key,
            codec.EMPTY_PROPERTIES_RAW,
            body_bytes(body_size),
            frame_max,
        )
        self.message_bytes = len(message)
        self.tag_offset = _ENVELOPE_BYTES + 4 + 1 + len(consumer_tag.encode())
        body_start = len(message) - _body_frames_bytes(body_size, frame_max) + _ENVELOPE_BYTES
        self.stamp_offset = body_start if body_size >= STAMP_BYTES else -1
        self.count_max = max(1, PUBLISH_BATCH_BYTES_MAX // self.message_bytes)
        self.data = bytearray(message * self.count_max)
        self.view = memoryview(self.data)

    def take(self, count: int, first_tag: int) -> memoryview:
        assert 0 < count <= self.count_max, "count outside the batch"
        pack = _U64.pack_into
        data = self.data
        stamp = time.time_ns()
        for index in range(count):
            start = index * self.message_bytes
            pack(data, start + self.tag_offset, first_tag + index)
            if self.stamp_offset >= 0:
                pack(data, start + self.stamp_offset, stamp)
        return self.view[: count * self.message_bytes]


class AckBatch:
    """A consumer's acks, one basic.ack frame with multiple=false per delivery tag, as
    pika's `basic_ack(tag)` per message sends them.

    One frame is encoded by the codec and repeated `ACK_RUN_COUNT_MAX` times, once.
    `append` copies the first n frames of that template and writes n consecutive tags
    into them.
    """

    def __init__(self) -> None:
        frame = bytearray()
        codec.append_basic_ack(frame, CHANNEL, codec.DeliveryTag(0), False)
        self.frame_bytes = len(frame)
        self.template = memoryview(bytes(frame * ACK_RUN_COUNT_MAX))

    def append(self, out: bytearray, first_tag: int, count: int) -> None:
        """Append `count` basic.ack frames for tags `first_tag`, `first_tag + 1`, ..."""
        assert first_tag > 0 and count >= 0, "delivery tags start at 1"
        while count > 0:
            run = min(count, ACK_RUN_COUNT_MAX)
            self._append_run(out, first_tag, run)
            first_tag += run
            count -= run

    def _append_run(self, out: bytearray, first_tag: int, count: int) -> None:
        # Hot path: the tags are packed big-endian by array in C, then each of their
        # eight octets goes into every frame with one strided slice assignment, so a
        # read of a thousand deliveries costs about a dozen calls, not a thousand packs.
        tags = array("Q", range(first_tag, first_tag + count))
        assert tags.itemsize == _TAG_BYTES, "array 'Q' is not 64 bits here"
        if sys.byteorder == "little":
            tags.byteswap()
        packed = tags.tobytes()
        start = len(out)
        out += self.template[: count * self.frame_bytes]
        end = len(out)
        for octet in range(_TAG_BYTES):
            first = start + _ACK_TAG_OFFSET + octet
            out[first : end : self.frame_bytes] = packed[octet::_TAG_BYTES]
