"""Micro benchmark of the delivery writer (STYLE.md section 11).

Measures, on one core and best of several rounds, deliveries/s of `encode_deliver`
(basic.deliver + content header + body frames appended to one bytearray, cleared every
100 deliveries as a connection's output buffer is after a socket write):
- the Python `encode_deliver` it replaced (tests/unit/amqp_gateway/deliver_reference.py);
- the C `_deliver.encode_deliver`, its drop-in replacement;
for 16 B, 1 KiB and 200 KiB bodies (the last is two body frames at frame_max 131072).
Both get the same arguments as the broker passes: str names, the stored properties and
body as bytes.

Run: .venv/bin/python benchmarks/deliver_bench.py [--scale N]
Needs the extension built in place (see amqp_gateway/codec/_deliver.c). Reports hardware
and Python version with every number; no fsync or disk is involved.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' reference

from amqp_gateway.codec import BasicProperties, ChannelId, DeliveryTag, encode_properties
from amqp_gateway.codec._deliver import encode_deliver as c_encode_deliver
from benchmarks.machine import best_seconds, cpu_model
from tests.unit.amqp_gateway.deliver_reference import encode_deliver as python_encode_deliver

FRAME_MAX = 131072
FLUSH_EVERY = 100
ROUNDS = 5
CHANNEL = ChannelId(1)
# Body size -> deliveries per round at --scale 1 (about 0.1-0.3 s per round in Python).
BODY_SIZES = {16: 200_000, 1024: 200_000, 200 * 1024: 4_000}


def deliveries(
    encode_deliver: Callable[..., None], messages: int, properties_raw: bytes, body: bytes
) -> None:
    out = bytearray()
    for i in range(messages):
        encode_deliver(
            out, CHANNEL, "ctag-1", DeliveryTag(i + 1), False, "amq.topic", "k.1",
            properties_raw, body, FRAME_MAX,
        )  # fmt: skip
        if i % FLUSH_EVERY == 0:
            out.clear()


def same_output(properties_raw: bytes, body: bytes) -> bool:
    outs = []
    for encode_deliver in (python_encode_deliver, c_encode_deliver):
        out = bytearray()
        encode_deliver(
            out, CHANNEL, "ctag-1", DeliveryTag(1), False, "amq.topic", "k.1",
            properties_raw, body, FRAME_MAX,
        )  # fmt: skip
        outs.append(out)
    return outs[0] == outs[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the counts")
    scale = parser.parse_args().scale
    print(f"Python {sys.version.split()[0]} ({platform.python_implementation()})")
    print(f"Machine: {cpu_model()}, {platform.machine()}, {platform.system()}")
    print(
        f"frame_max {FRAME_MAX}, output cleared every {FLUSH_EVERY} deliveries; "
        f"fsync: none (codec only); best of {ROUNDS}"
    )
    properties_raw = encode_properties(BasicProperties(content_type="application/octet-stream"))
    for size, count in BODY_SIZES.items():
        messages = max(1, int(count * scale))
        body = b"x" * size
        assert same_output(properties_raw, body), "the two functions disagree"
        python = best_seconds(
            partial(deliveries, python_encode_deliver, messages, properties_raw, body), ROUNDS
        )
        c = best_seconds(
            partial(deliveries, c_encode_deliver, messages, properties_raw, body), ROUNDS
        )
        print(f"body {size:>7,} B ({messages:,} deliveries):")
        print(f"  {'Python encode_deliver':<24} {messages / python:>12,.0f} deliveries/s")
        print(f"  {'C encode_deliver':<24} {messages / c:>12,.0f} deliveries/s  x{python / c:.2f}")


if __name__ == "__main__":
    main()
