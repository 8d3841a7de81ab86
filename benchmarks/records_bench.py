"""Micro benchmark of record encoding on the publish path (STYLE.md section 11).

Measures, on one core and best of several rounds, in records/s:
- encode_records: the C encoder (`streamq.log._records`) appending runs of records that
  share an exchange, routing key and timestamp to one bytearray;
- python loop: the same records built with `format.encode_record_parts` and appended with
  `bytearray +=`, as `SegmentLog.append_one` does one message at a time;
for 16-byte and 1 KiB bodies, with a 10-byte exchange, a 6-byte routing key and 14 bytes
of properties. The buffer is cleared every 1 MiB (the log's write buffer size), as a flush
would. Also CRC32C throughput, the C module's against the crc32c package, on 16 B and
64 KiB.

Run: .venv/bin/python benchmarks/records_bench.py [--seconds S] [--run N]
Needs the extension built (setup.py, or the gcc line at the top of streamq/log/_records.c).
Reports hardware and Python version with every number; no disk or fsync is involved.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import crc32c as crc32c_package

from benchmarks.machine import cpu_model
from streamq.log import _records
from streamq.log.format import encode_record_parts

EXCHANGE = b"amq.direct"
ROUTING_KEY = b"orders"
# Property flags with content-type and delivery-mode set, then those two fields.
PROPERTIES = b"\x90\x00\x0atext/plain\x02"
WRITE_BUFFER_BYTES_MAX = 1 << 20
ROUNDS = 5


def environment() -> str:
    cpu = cpu_model()
    return (
        f"cpu: {cpu}, {os.cpu_count()} cores; python {platform.python_version()} "
        f"({platform.python_implementation()}); crc32c hardware: C module "
        f"{_records.CRC32C_HARDWARE}, package {crc32c_package.hardware_based}"
    )


def best_rate(step: Callable[[], int], seconds: float) -> float:
    """Best of ROUNDS rounds of `seconds / ROUNDS` each: units per second of `step`."""
    best = 0.0
    for _ in range(ROUNDS):
        done = 0
        began = time.perf_counter()
        deadline = began + seconds / ROUNDS
        while True:
            done += step()
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, done / (now - began))
    return best


def c_encoder(messages: list[tuple[bytes, bytes]]) -> Callable[[], int]:
    buffer = bytearray()
    encode = _records.encode_records
    limit = sys.maxsize
    offset = 0

    def step() -> int:
        nonlocal offset
        stop = encode(
            buffer, offset, 1_700_000_000_000, EXCHANGE, ROUTING_KEY, messages, 0,
            limit, limit, limit,
        )  # fmt: skip
        offset += stop
        if len(buffer) >= WRITE_BUFFER_BYTES_MAX:
            del buffer[:]
        return stop

    return step


def python_loop(messages: list[tuple[bytes, bytes]]) -> Callable[[], int]:
    buffer = bytearray()
    encode = encode_record_parts
    offset = 0

    def step() -> int:
        nonlocal buffer, offset
        # The loop SegmentLog.append_one amounts to per message, minus its bookkeeping.
        for properties, body in messages:
            buffer += encode(offset, 1_700_000_000_000, EXCHANGE, ROUTING_KEY, properties, body)
            offset += 1
        if len(buffer) >= WRITE_BUFFER_BYTES_MAX:
            del buffer[:]
        return len(messages)

    return step


def crc_rate(crc: Callable[[bytes], int], data: bytes) -> Callable[[], int]:
    def step() -> int:
        for _ in range(100):
            crc(data)
        return 100 * len(data)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per case")
    parser.add_argument("--run", type=int, default=64, help="messages per encode_records call")
    args = parser.parse_args()
    print(environment())
    print(
        f"records: exchange {len(EXCHANGE)} B, routing key {len(ROUTING_KEY)} B, "
        f"properties {len(PROPERTIES)} B; runs of {args.run}; best of {ROUNDS}"
    )
    for body_bytes in (16, 1024):
        messages = [(PROPERTIES, os.urandom(body_bytes)) for _ in range(args.run)]
        single = messages[:1]
        c_run = best_rate(c_encoder(messages), args.seconds)
        c_one = best_rate(c_encoder(single), args.seconds)
        py = best_rate(python_loop(messages), args.seconds)
        print(
            f"body {body_bytes:5d} B: encode_records {c_run / 1e6:6.2f} M records/s "
            f"(runs of 1: {c_one / 1e6:5.2f} M), python loop {py / 1e6:5.2f} M records/s, "
            f"x{c_run / py:.1f}"
        )
    for size in (16, 64 * 1024):
        data = os.urandom(size)
        ours = best_rate(crc_rate(_records.crc32c, data), args.seconds)
        theirs = best_rate(crc_rate(crc32c_package.crc32c, data), args.seconds)
        portable = best_rate(crc_rate(_records._crc32c_portable, data), args.seconds)
        print(
            f"crc32c {size:6d} B: C module {ours / 1e6:8.1f} MB/s "
            f"({ours / size / 1e6:5.2f} M calls/s), package {theirs / 1e6:8.1f} MB/s "
            f"({theirs / size / 1e6:5.2f} M calls/s), portable {portable / 1e6:8.1f} MB/s"
        )


if __name__ == "__main__":
    main()
