"""Micro benchmark of `StoredMessage` (`streamq/broker/_message.c`) against the Python class
with `__slots__` it replaced.

Measures, on one core and best of several rounds, nanoseconds per operation:
- construct: `StoredMessage(offset, exchange, routing_key, properties, body, refs, ts)`;
- read the four str and bytes fields (what a delivery reads);
- read offset and refs;
- release: `refs -= 1` and a test of the result, as the settle path does (the C type's
  `release()`; the Python class's two attribute operations);
and what the collector does with each: whether an instance is tracked, and how long a
full collection takes with 1,000,000 of them alive.

Run: .venv/bin/python benchmarks/message_bench.py [--count N]
Needs the extension built (setup.py, or the gcc line at the top of the C source).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_model
from streamq.broker.queue import StoredMessage

ROUNDS = 5
LOOP = 1000
LIVE_MESSAGES = 1_000_000


class SlottedMessage:
    """The Python class `StoredMessage` was before it moved to C."""

    __slots__ = (
        "body",
        "exchange",
        "offset",
        "properties_raw",
        "refs",
        "routing_key",
        "timestamp_ms",
    )

    def __init__(
        self,
        offset: int,
        exchange: str,
        routing_key: str,
        properties_raw: bytes,
        body: bytes,
        refs: int,
        timestamp_ms: int = 0,
    ) -> None:
        self.offset = offset
        self.timestamp_ms = timestamp_ms
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties_raw = properties_raw
        self.body = body
        self.refs = refs


Factory = Callable[..., object]


def best_ns(operation: Callable[[], None], count: int) -> float:
    """Best of ROUNDS runs of `operation` (which does `count` operations): ns each."""
    best = float("inf")
    for _ in range(ROUNDS):
        began = time.perf_counter_ns()
        operation()
        best = min(best, (time.perf_counter_ns() - began) / count)
    return best


def construct(factory: Factory) -> Callable[[], None]:
    def run() -> None:
        for i in range(LOOP):
            factory(1_000_000 + i, "amq.direct", "orders", b"\x90\x00", b"body", 1, 1)

    return run


def read_objects(message: StoredMessage | SlottedMessage) -> Callable[[], None]:
    def run() -> None:
        for _ in range(LOOP):
            _ = message.body
            _ = message.exchange
            _ = message.routing_key
            _ = message.properties_raw

    return run


def read_integers(message: StoredMessage | SlottedMessage) -> Callable[[], None]:
    def run() -> None:
        for _ in range(LOOP):
            _ = message.offset
            _ = message.refs

    return run


def release_slotted(message: SlottedMessage) -> Callable[[], None]:
    def run() -> None:
        for _ in range(LOOP):
            message.refs -= 1  # as VHost.release did before release()
            if message.refs <= 0:
                message.refs = 10**6

    return run


def release_c(message: StoredMessage) -> Callable[[], None]:
    def run() -> None:
        for _ in range(LOOP):
            if message.release() <= 0:
                message.refs = 10**6

    return run


def full_collection_ms(factory: Factory, count: int) -> float:
    live = [factory(i, "amq.direct", "orders", b"", b"body", 1, 1) for i in range(count)]
    began = time.perf_counter()
    gc.collect()
    elapsed_ms = (time.perf_counter() - began) * 1000
    del live
    return elapsed_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=LIVE_MESSAGES, help="live messages")
    args = parser.parse_args()
    print(
        f"cpu: {cpu_model()}, {os.cpu_count()} cores; python {platform.python_version()} "
        f"({platform.python_implementation()})"
    )
    c_message = StoredMessage(123_456_789, "amq.direct", "orders", b"", b"body", 10**6, 1)
    py_message = SlottedMessage(123_456_789, "amq.direct", "orders", b"", b"body", 10**6, 1)
    rows = [
        ("construct", construct(SlottedMessage), construct(StoredMessage)),
        ("read 4 str/bytes fields", read_objects(py_message), read_objects(c_message)),
        ("read offset and refs", read_integers(py_message), read_integers(c_message)),
        ("refs -= 1 and test", release_slotted(py_message), release_c(c_message)),
    ]
    print(f"{'operation':<26}{'Python __slots__':>18}{'C StoredMessage':>18}")
    for name, slotted, in_c in rows:
        print(f"{name:<26}{best_ns(slotted, LOOP):>15.1f} ns{best_ns(in_c, LOOP):>15.1f} ns")
    print(
        f"{'tracked by the collector':<26}{gc.is_tracked(py_message)!s:>18}"
        f"{gc.is_tracked(c_message)!s:>18}"
    )
    slotted_ms = full_collection_ms(SlottedMessage, args.count)
    c_ms = full_collection_ms(StoredMessage, args.count)
    print(f"{f'gc.collect(), {args.count:,} live':<26}{slotted_ms:>15.1f} ms{c_ms:>15.1f} ms")


if __name__ == "__main__":
    main()
