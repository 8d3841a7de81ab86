"""Micro benchmark of the receive loop's publish splitting (STYLE.md section 11).

Measures, on one core and best of several rounds, messages/s over one buffer of whole
basic.publish messages (method, content header, one 16-byte body frame):
- a loop of `basic.read_publish`, as `Connection._receive_publishes` runs it, keeping
  each message in a list as the loop keeps its events;
- the C `_scan.scan_publishes`, in runs of `count_max` messages (1 = one call per
  message, the worst case; unbounded = the whole buffer in one call).
Both over the same buffer, once with one routing key for all messages (names and
properties are shared objects) and once with a different key per message (a run ends
where the routing key changes, so each call then reads one message).

Run: .venv/bin/python benchmarks/scan_bench.py [--messages N]
Needs the extension built in place (see amqp_gateway/codec/_scan.c). Reports hardware
and Python version with every number; no fsync or disk is involved.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amqp_gateway.codec import (
    FRAME_OVERHEAD_BYTES,
    BasicProperties,
    ChannelId,
    append_content_frames,
    encode_properties,
)
from amqp_gateway.codec._scan import scan_publishes
from amqp_gateway.codec.basic import read_publish
from amqp_gateway.codec.methods import BasicPublish
from benchmarks.machine import cpu_model

BODY_BYTES = 16
FRAME_MAX = 131072
PAYLOAD_MAX = FRAME_MAX - FRAME_OVERHEAD_BYTES
ROUNDS = 5
CHANNEL = ChannelId(1)
RUN_SIZES = (1, 16, 256, sys.maxsize)


def best_seconds(run: Callable[[], int], messages: int) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        count = run()
        best = min(best, time.perf_counter() - start)
        assert count == messages, f"read {count} of {messages} messages"
    return best


def publish_stream(messages: int, distinct_keys: bool) -> bytes:
    properties_raw = encode_properties(BasicProperties(content_type="application/octet-stream"))
    body = b"x" * BODY_BYTES
    out = bytearray()
    for i in range(messages):
        method = BasicPublish(exchange="amq.topic", routing_key=f"k.{i if distinct_keys else 1}")
        append_content_frames(out, CHANNEL, method, properties_raw, body, FRAME_MAX)
    return bytes(out)


def read_publish_loop(stream: bytes) -> int:
    kept = []
    append = kept.append
    position = 0
    with memoryview(stream) as view:
        while (message := read_publish(view, position, PAYLOAD_MAX)) is not None:
            append(message)
            position = message.end
    return len(kept)


def scan_loop(stream: bytes, count_max: int) -> int:
    kept = []
    position = 0
    with memoryview(stream) as view:
        while True:
            _, position, messages, _, _ = scan_publishes(
                view, position, PAYLOAD_MAX, PAYLOAD_MAX, count_max
            )
            if not messages:
                return len(kept)
            kept += messages


def report(label: str, count: int, seconds: float, baseline: float) -> None:
    print(f"  {label:<44} {count / seconds:>12,.0f} msgs/s  x{baseline / seconds:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    messages = parser.parse_args().messages
    print(f"Python {sys.version.split()[0]} ({platform.python_implementation()})")
    print(f"Machine: {cpu_model()}, {platform.machine()}, {platform.system()}")
    print(
        f"Messages: {messages:,}, body {BODY_BYTES} B, frame_max {FRAME_MAX}; "
        f"fsync: none (codec only); best of {ROUNDS}"
    )
    for distinct_keys in (False, True):
        stream = publish_stream(messages, distinct_keys)
        keys = "a routing key per message" if distinct_keys else "one routing key"
        print(f"{keys} (stream {len(stream):,} B):")
        baseline = best_seconds(partial(read_publish_loop, stream), messages)
        report("read_publish loop", messages, baseline, baseline)
        for count_max in RUN_SIZES:
            seconds = best_seconds(partial(scan_loop, stream, count_max), messages)
            run = "unbounded" if count_max == sys.maxsize else str(count_max)
            report(f"scan_publishes, count_max {run}", messages, seconds, baseline)


if __name__ == "__main__":
    main()
