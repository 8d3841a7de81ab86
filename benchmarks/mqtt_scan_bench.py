"""Micro benchmark of the MQTT receive loop's PUBLISH splitting (STYLE.md section 11).

Measures, on one core and best of several rounds, packets/s over one buffer of QoS 1
PUBLISH packets to one topic (MQTT 3.1.1, 16-byte payloads):
- `Decoder.feed`, the packet-by-packet decoder (a `Publish` dataclass per packet);
- `Decoder.push` and `pop` with a `RunForm`, the session's path: runs split by the C
  scanner `mqtt_gateway.codec._scan` into the broker's run messages and the PUBLISH's
  PUBACKs, `RUN_MESSAGES_MAX` packets a run.
No broker, socket or disk is involved.

Run: PYTHONPATH=. .venv/bin/python -m benchmarks.mqtt_scan_bench [--messages N]
Needs the extension built in place (`python setup.py build_ext --inplace`).
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

from benchmarks.machine import cpu_model
from mqtt_gateway.broker_side import run_form
from mqtt_gateway.codec import Decoder, ProtocolLevel, Publish, encode

LEVEL = ProtocolLevel.MQTT_3_1_1
ROUNDS = 5


def buffer(messages: int) -> bytes:
    return b"".join(
        encode(Publish("sensors/t1", b"0123456789abcdef", 1, False, False, i % 0xFFFF + 1), LEVEL)
        for i in range(messages)
    )


def by_packets(data: bytes) -> int:
    return len(Decoder(LEVEL).feed(data))


def by_runs(data: bytes) -> int:
    form = run_form(None)
    decoder = Decoder(LEVEL)
    decoder.push(data)
    count = 0
    while (item := decoder.pop(form)) is not None:
        count += len(item.messages) if not isinstance(item, Publish) else 1  # type: ignore[union-attr]
    return count


def best_rate(read: Callable[[bytes], int], data: bytes, messages: int) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        assert read(data) == messages
        best = min(best, time.perf_counter() - start)
    return messages / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    args = parser.parse_args()
    data = buffer(args.messages)
    print(f"{cpu_model()}, Python {platform.python_version()}; {args.messages} QoS 1 PUBLISH")
    for name, read in (("Decoder.feed", by_packets), ("push/pop runs", by_runs)):
        print(f"{name:15} {best_rate(read, data, args.messages) / 1e6:6.2f} M packets/s")


if __name__ == "__main__":
    main()
