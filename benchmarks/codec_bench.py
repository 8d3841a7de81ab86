"""Micro benchmark of the AMQP codec's hot path (STYLE.md section 11).

Measures, on one core and best of several rounds:
- split_frames: frames/s over a buffer of basic.publish + content header + body triples
  (16-byte body), both as one buffer and fed in 64 KiB reads as a socket would;
- publish decoding: split, decode basic.publish and the content header, per message;
- encode_deliver: deliveries/s written into one bytearray, flushed every 100 messages;
- for reference, the generic table-driven paths and pamqp's decoder.

Run: .venv/bin/python benchmarks/codec_bench.py [--messages N]
Reports hardware and Python version with every number; no fsync or disk is involved.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pamqp import frame as pamqp_frame

from amqp_gateway.codec import (
    ChannelId,
    DeliveryTag,
    Frame,
    append_body_frames,
    append_content_header_frame,
    append_method_frame,
    decode_content_header,
    decode_method,
    encode_deliver,
    encode_frame,
    encode_properties,
    split_frames,
)
from amqp_gateway.codec.basic import BASIC_PUBLISH_IDS, decode_basic_publish, read_basic_publish
from amqp_gateway.codec.method_frame import _read_fields
from amqp_gateway.codec.methods import BasicDeliver, BasicPublish
from amqp_gateway.codec.properties import BasicProperties
from benchmarks.deliver_bench import deliveries
from benchmarks.machine import best_seconds, cpu_model

BODY_BYTES = 16
FRAME_MAX = 131072
READ_BYTES = 65536
FLUSH_EVERY = 100
ROUNDS = 5
CHANNEL = ChannelId(1)


def publish_stream(messages: int) -> bytes:
    properties_raw = encode_properties(BasicProperties(content_type="application/octet-stream"))
    body = b"x" * BODY_BYTES
    out = bytearray()
    for i in range(messages):
        append_method_frame(out, CHANNEL, BasicPublish(exchange="amq.topic", routing_key=f"k.{i}"))
        append_content_header_frame(out, CHANNEL, len(body), properties_raw, FRAME_MAX)
        append_body_frames(out, CHANNEL, body, FRAME_MAX)
    return bytes(out)


def split_in_reads(stream: bytes) -> int:
    """Feed `stream` in READ_BYTES pieces through a receive buffer, as the server will."""
    buffer = bytearray()
    count = 0
    for start in range(0, len(stream), READ_BYTES):
        buffer += stream[start : start + READ_BYTES]
        frames, consumed = split_frames(buffer, FRAME_MAX)
        del buffer[:consumed]
        count += len(frames)
    return count


def receive_publishes(stream: bytes, fast: bool) -> int:
    """The receive path over 64 KiB reads: split, then decode each publish and header,
    through `read_basic_publish` (fast) or the general `decode_method`."""
    buffer = bytearray()
    count = 0
    pending: list[Frame] = []
    for start in range(0, len(stream), READ_BYTES):
        buffer += stream[start : start + READ_BYTES]
        frames, consumed = split_frames(buffer, FRAME_MAX)
        del buffer[:consumed]
        pending += frames
        whole = len(pending) - len(pending) % 3
        for i in range(0, whole, 3):
            payload = pending[i].payload
            if fast and payload.startswith(BASIC_PUBLISH_IDS):
                read_basic_publish(payload)
            else:
                decode_method(payload)
            decode_content_header(pending[i + 1].payload)
            count += 1
        del pending[:whole]
    return count


def decode_publishes_generic(payloads: list[bytes]) -> None:
    plan = tuple((f.name, f.kind) for f in BasicPublish.SPEC.fields)
    for payload in payloads:
        values, _ = _read_fields(plan, payload)
        BasicPublish(*values)


def deliveries_generic(messages: int, properties_raw: bytes, body: bytes) -> None:
    out = bytearray()
    for i in range(messages):
        method = BasicDeliver("ctag-1", DeliveryTag(i + 1), False, "amq.topic", "k.1")
        append_method_frame(out, CHANNEL, method)
        append_content_header_frame(out, CHANNEL, len(body), properties_raw, FRAME_MAX)
        append_body_frames(out, CHANNEL, body, FRAME_MAX)
        if i % FLUSH_EVERY == 0:
            out.clear()


def pamqp_decode(frame_bytes: list[bytes]) -> None:
    for data in frame_bytes:
        pamqp_frame.unmarshal(data)


def report(label: str, count: int, seconds: float, unit: str) -> None:
    print(f"  {label:<52} {count / seconds:>12,.0f} {unit}/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    messages = parser.parse_args().messages
    stream = publish_stream(messages)
    frames, _ = split_frames(stream, FRAME_MAX)
    publish_payloads = [frames[i].payload for i in range(0, len(frames), 3)]
    properties_raw = encode_properties(BasicProperties(content_type="application/octet-stream"))
    body = b"x" * BODY_BYTES

    print(f"Python {sys.version.split()[0]} ({platform.python_implementation()})")
    print(f"Machine: {cpu_model()}, {platform.machine()}, {platform.system()}")
    print(
        f"Messages: {messages:,}, body {BODY_BYTES} B, frame_max {FRAME_MAX}, "
        f"stream {len(stream):,} B; fsync: none (codec only); best of {ROUNDS}"
    )
    frame_count = 3 * messages
    # One call over the whole stream builds 150k frames at once; the cyclic GC's passes
    # over that many live tuples make it slower per frame than the 64 KiB reads below.
    report(
        "split_frames, whole buffer",
        frame_count,
        best_seconds(lambda: split_frames(stream, FRAME_MAX), ROUNDS),
        "frames",
    )
    report(
        f"split_frames, {READ_BYTES // 1024} KiB reads",
        frame_count,
        best_seconds(lambda: split_in_reads(stream), ROUNDS),
        "frames",
    )
    report(
        "64 KiB reads: split + read_basic_publish + header",
        messages,
        best_seconds(lambda: receive_publishes(stream, fast=True), ROUNDS),
        "msgs",
    )
    report(
        "64 KiB reads: split + decode_method + header",
        messages,
        best_seconds(lambda: receive_publishes(stream, fast=False), ROUNDS),
        "msgs",
    )
    report(
        "read_basic_publish (tuple)",
        messages,
        best_seconds(lambda: [read_basic_publish(p) for p in publish_payloads], ROUNDS),
        "msgs",
    )
    report(
        "decode_basic_publish (dataclass)",
        messages,
        best_seconds(lambda: [decode_basic_publish(p) for p in publish_payloads], ROUNDS),
        "msgs",
    )
    report(
        "decode basic.publish, generic table-driven path",
        messages,
        best_seconds(lambda: decode_publishes_generic(publish_payloads), ROUNDS),
        "msgs",
    )
    report(
        "encode_deliver (deliver + header + body frames)",
        messages,
        best_seconds(lambda: deliveries(encode_deliver, messages, properties_raw, body), ROUNDS),
        "deliveries",
    )
    report(
        "deliver via dataclass + generic writer",
        messages,
        best_seconds(lambda: deliveries_generic(messages, properties_raw, body), ROUNDS),
        "deliveries",
    )
    # pamqp decodes one frame per call from the start of its input; give it each frame.
    frame_bytes = [encode_frame(f.frame_type, f.channel, f.payload) for f in frames[:30_000]]
    report(
        "pamqp.frame.unmarshal, one frame per call (reference)",
        len(frame_bytes),
        best_seconds(lambda: pamqp_decode(frame_bytes), ROUNDS),
        "frames",
    )


if __name__ == "__main__":
    main()
