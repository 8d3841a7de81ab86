"""A consumer that gives some of its deliveries back (issue 30, "requeue-heavy work").

Owns one consume loop over a raw socket, prefetch P: every delivery of a read is settled
in one `sendall`, each with its own frame, as pika's `basic_ack(tag)` sends them; the
shape decides which are given back:

- `nack` / `reject`: every delivery whose tag is a multiple of `every` is nacked or
  rejected with requeue (every=100: 1% of deliveries, every=10: 10%), the others acked;
- `recover`: every `every`-th read is not acked: a basic.recover (requeue=true) gives
  back everything unacked instead, and the deliveries that come before its recover-ok
  were requeued by it too (they are not acked).

It stops once `total` deliveries were acked (each message acked once: the queue is then
empty) and returns the seconds it took and the deliveries received. The frame walk is
Python (a tuple per delivery): it keeps up with a few hundred thousand deliveries a
second, more than the brokers give back here. Used by `benchmarks/drain_compare.py`.
"""

from __future__ import annotations

import struct
import time
from typing import Final

from amqp_gateway import codec
from amqp_gateway.codec import methods as m
from streamq.perf.client import AmqpClient
from streamq.perf.uri import parse_uri
from streamq.perf.wire import CHANNEL, RecvBuffer

READ_TIMEOUT_S: Final = 30.0
SHAPES: Final = ("nack", "reject", "recover")
_ENVELOPE = struct.Struct(">BHI")
_IDS = struct.Struct(">I")
_TAG = struct.Struct(">Q")
_DELIVER: Final = 60 << 16 | 60
_RECOVER_OK: Final = 60 << 16 | 111
_CLOSES: Final = frozenset((20 << 16 | 40, 10 << 16 | 50))  # channel.close, connection.close


def _frame(method: m.Method) -> bytes:
    return codec.encode_method_frame(CHANNEL, method)


def scan(buffer: RecvBuffer) -> list[int]:
    """The complete frames in `buffer`, in order: each basic.deliver's tag, -1 for a
    basic.recover-ok. Raises RuntimeError for a close from the broker."""
    data, position, end = buffer.data, buffer.start, buffer.end
    out: list[int] = []
    while end - position >= 7:
        frame_type, _channel, size = _ENVELOPE.unpack_from(data, position)
        frame_end = position + 7 + size
        if frame_end >= end:
            break
        if frame_type == 1:
            ids = _IDS.unpack_from(data, position + 7)[0]
            if ids == _DELIVER:
                payload = position + 7
                out.append(_TAG.unpack_from(data, payload + 5 + data[payload + 4])[0])
            elif ids == _RECOVER_OK:
                out.append(-1)
            elif ids in _CLOSES:
                method = codec.decode_method(bytes(data[position + 7 : frame_end]))
                raise RuntimeError(f"the broker closed: {method}")
        position = frame_end + 1
    buffer.start = position
    return out


def _tags_of(frames: list[codec.Frame]) -> list[int]:
    """`scan` of frames a set-up call read past its reply."""
    out: list[int] = []
    for frame in frames:
        if frame.frame_type == codec.FRAME_METHOD:
            method = codec.decode_method(frame.payload)
            if isinstance(method, m.BasicDeliver):
                out.append(method.delivery_tag)
            elif isinstance(method, m.BasicRecoverOk):
                out.append(-1)
    return out


class Settler:
    """What one read's deliveries get: acks, and nacks, rejects or a recover."""

    def __init__(self, shape: str, every: int) -> None:
        assert shape in SHAPES and every > 0
        self.shape, self.every = shape, every
        self.acked = 0
        self.deliveries = 0
        self.reads = 0
        self.recovering = False

    def settle(self, tags: list[int]) -> bytes:
        out = bytearray()
        fresh: list[int] = []
        for tag in tags:
            if tag < 0:
                self.recovering = False  # later deliveries are after the recover
            elif not self.recovering:
                fresh.append(tag)
        self.deliveries += sum(1 for tag in tags if tag >= 0)
        if not fresh:
            return b""
        self.reads += 1
        if self.shape == "recover" and self.reads % self.every == 0:
            self.recovering = True
            return _frame(m.BasicRecover(requeue=True))
        for tag in fresh:
            delivery_tag = codec.DeliveryTag(tag)
            if self.shape != "recover" and tag % self.every == 0:
                if self.shape == "nack":
                    out += _frame(m.BasicNack(delivery_tag, False, True))
                else:
                    out += _frame(m.BasicReject(delivery_tag, True))
            else:
                codec.append_basic_ack(out, CHANNEL, delivery_tag, False)
                self.acked += 1
        return bytes(out)


def consume(url: str, queue: str, total: int, prefetch: int, shape: str, every: int) -> float:
    """Consume until `total` messages were acked; returns the seconds it took."""
    client = AmqpClient.connect(parse_uri(url))
    try:
        client.call(m.BasicQos(prefetch_count=prefetch), m.BasicQosOk)
        client.call(m.BasicConsume(queue=queue, consumer_tag="requeue"), m.BasicConsumeOk)
        sock = client.sock
        sock.settimeout(READ_TIMEOUT_S)
        settler = Settler(shape, every)
        started = time.monotonic()
        buffer = client.buffer
        first = settler.settle(_tags_of(client.leftover_frames()))
        if first:
            sock.sendall(first)
        while settler.acked < total:
            buffer.fill(sock)
            out = settler.settle(scan(buffer))
            if out:
                sock.sendall(out)
        return time.monotonic() - started
    finally:
        client.close()
