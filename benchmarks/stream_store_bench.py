"""Micro benchmark of the stream protocol's storage hot paths (STYLE.md section 11).

Measures, on one core and best of several rounds, in messages/s:
- append_publish: `StreamQueue.append_publish` of Publish payloads of N messages each (the
  C parser and encoder, then `SegmentLog.append_encoded`), with a publisher reference (so
  deduplication is checked) and without; the log syncs (fdatasync on its Syncer thread)
  every 64 frames, as a busy broker's group commit would;
  The appending thread's CPU time is reported too: on a busy or slow disk the wall clock
  measures the disk;
- read_chunk: `StreamQueue.read_chunk` over the durable records (native ones: a copy of
  each body), chunks of up to 4096 entries or 1 MiB, and the same with a filter of one
  value that every record matches.
Bodies are 16 bytes (and 1 KiB with --body 1024). The log lives in a temporary
directory (on TMPDIR's file system), in segment format version 2 (streams' chunks; the
stored chunks are read, a copy of their bytes) or, with --format 1, version 1.

Run: .venv/bin/python benchmarks/stream_store_bench.py [--seconds S] [--messages N]
Needs the extensions built (setup.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_model
from retention.rules import RetentionRules
from streamq.log.log import LogConfig, SegmentLog
from streamq.queues.chunks import ChunkFilter
from streamq.queues.offsets import OffsetStore
from streamq.queues.stream import StreamQueue

SYNC_EVERY_FRAMES = 64


def publish_payload(first_id: int, count: int, body: bytes, filter_value: bytes | None) -> bytes:
    parts = [struct.pack(">I", count)]
    for i in range(first_id, first_id + count):
        parts.append(struct.pack(">Q", i))
        if filter_value is not None:
            parts.append(struct.pack(">h", len(filter_value)) + filter_value)
        parts.append(struct.pack(">I", len(body)) + body)
    return b"".join(parts)


def open_stream(directory: str, format_version: int = 2) -> StreamQueue:
    config = LogConfig(segment_bytes_max=64 << 20, format_version=format_version)
    log = SegmentLog.open(os.path.join(directory, "log"), config)
    return StreamQueue(log, RetentionRules(), OffsetStore.open(os.path.join(directory, "off")))


def bench_publish(
    stream: StreamQueue, reference: bytes, count: int, body: bytes, seconds: float
) -> tuple[float, float]:
    """Messages/s appended, by the wall clock (the disk's writes and fdatasyncs included)
    and by the appending thread's CPU time; the payloads are built off the clocks."""
    frames = 0
    cpu = time.thread_time()
    next_id = stream.publishers.sequence(reference) + 1
    payloads = []
    for _ in range(64):
        payloads.append(publish_payload(next_id, count, body, b"eu" if reference else None))
        next_id += count
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        for payload in payloads:
            stream.append_publish(reference, 2 if reference else 1, payload, 0)
            frames += 1
        stream.log.sync_blocking()
        elapsed = time.perf_counter() - start
        # Fresh ids for the next round (outside the clock would need a pause: the ids of
        # a reference must rise, so the same payloads would all be duplicates).
        if reference:
            t, c = time.perf_counter(), time.thread_time()
            payloads = [publish_payload(next_id + i * count, count, body, b"eu") for i in range(64)]
            next_id += 64 * count
            start += time.perf_counter() - t
            cpu += time.thread_time() - c
    return frames * count / elapsed, frames * count / (time.thread_time() - cpu)


def bench_chunks(stream: StreamQueue, seconds: float, filter: ChunkFilter | None) -> float:
    """Messages/s put into chunks, reading the whole stream over and over."""
    messages = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        offset = 0
        while True:
            chunk = stream.read_chunk(offset, 4096, 1 << 20, filter)
            if chunk is None:
                break
            messages += chunk.records
            offset = chunk.next_offset
        elapsed = time.perf_counter() - start
    return messages / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--messages", type=int, default=1000, help="messages per frame")
    parser.add_argument("--body", type=int, default=16, help="body bytes")
    parser.add_argument("--run", type=int, default=3, help="rounds (best is reported)")
    parser.add_argument(
        "--format", type=int, default=2, choices=(1, 2), help="segment format (2: streams')"
    )
    args = parser.parse_args()
    body = b"x" * args.body
    print(f"CPU: {cpu_model()}; Python {platform.python_version()}; body {args.body} B; ")
    print(f"{args.messages} messages per Publish frame; TMPDIR {tempfile.gettempdir()}")
    with tempfile.TemporaryDirectory() as directory:
        stream = open_stream(directory, args.format)
        print(f"segment format version {args.format}")
        for name, reference in (
            ("append_publish (v1, no reference)", b""),
            ("append_publish (v2, reference, filter)", b"producer-1"),
        ):
            wall, cpu = max(bench_publish(stream, reference, args.messages, body, args.seconds)
                            for _ in range(args.run))  # fmt: skip
            print(f"{name:44s} {wall / 1e6:6.2f} M msgs/s (appending thread's CPU: "
                  f"{cpu / 1e6:.2f} M msgs/s)")  # fmt: skip
        stream.log.sync_blocking()
        print(f"stream: {stream.log.next_offset} records")
        for name, flt in (
            ("read_chunk", None),
            ("read_chunk (filter)", ChunkFilter(frozenset({b"eu"}), True)),
        ):
            best = max(bench_chunks(stream, args.seconds, flt) for _ in range(args.run))
            print(f"{name:44s} {best / 1e6:6.2f} M msgs/s")
        stream.log.close_blocking()
        stream.publishers.close()
        stream.offsets.close()


if __name__ == "__main__":
    main()
