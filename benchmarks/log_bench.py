"""Segment log benchmark: append, sequential read and seek, beside the raw disk speed.

Usage: python benchmarks/log_bench.py [--quick] [--dir DIR] [--json]

Every case is bounded by a record count and a time budget. The data directory defaults to
a temporary directory under the current directory (the disk the broker would use), not
/tmp, which may be tmpfs. Records carry a 10-byte exchange, a 6-byte routing key and
2 bytes of properties besides the body.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_model
from streamq.log.format import Message
from streamq.log.log import LogConfig, SegmentLog

KIB = 1024
MIB = 1024 * KIB


def environment(directory: str) -> dict[str, str]:
    cpu = cpu_model()
    fs = subprocess.run(
        ["df", "-T", directory], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "filesystem": fs[-1].split()[1] if len(fs) > 1 else "unknown",
        "data_dir": directory,
        "fsync": "fdatasync per segment file, fsync of the directory on create/delete",
    }


def raw_disk(directory: str, total_bytes: int) -> dict[str, float]:
    """Sequential 64 KiB writes with os.write: one fsync at the end, and one per 1 MiB."""
    block = os.urandom(64 * KIB)
    results = {}
    for name, sync_every in (("raw_write_MBps", 0), ("raw_write_fsync_1MiB_MBps", MIB)):
        path = os.path.join(directory, "raw.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        start = time.perf_counter()
        written = 0
        while written < total_bytes:
            written += os.write(fd, block)
            if sync_every and written % sync_every == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
        elapsed = time.perf_counter() - start
        os.close(fd)
        os.remove(path)
        results[name] = written / elapsed / MIB
    fd = os.open(os.path.join(directory, "fsync.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
    latencies = []
    for _ in range(50):
        os.write(fd, b"x" * 100)
        t = time.perf_counter()
        os.fdatasync(fd)
        latencies.append(time.perf_counter() - t)
    os.close(fd)
    results["fdatasync_median_us"] = statistics.median(latencies) * 1e6
    return results


def make_messages(body_bytes: int, count: int) -> list[Message]:
    body = os.urandom(body_bytes)
    return [Message(b"amq.direct", b"rk.key", b"\x00\x00", body)] * count


def bench_append(
    directory: str, body_bytes: int, batch: int, sync: bool, budget_s: float, records_max: int
) -> dict[str, float]:
    path = tempfile.mkdtemp(dir=directory)
    log = SegmentLog.open(path, LogConfig())
    messages = make_messages(body_bytes, batch)
    appended = 0
    start = time.perf_counter()
    while appended < records_max and time.perf_counter() - start < budget_s:
        log.append(messages, 1)
        if sync:
            log.sync_blocking()
        appended += batch
    log.sync_blocking()  # every case ends durable, so the figures compare
    elapsed = time.perf_counter() - start
    log.close_blocking()
    shutil.rmtree(path)
    record_bytes = 18 + 32 + body_bytes
    return {
        "records_per_s": appended / elapsed,
        "MBps": appended * record_bytes / elapsed / MIB,
        "records": appended,
    }


def filled_log(directory: str, body_bytes: int, count: int) -> SegmentLog:
    path = tempfile.mkdtemp(dir=directory)
    log = SegmentLog.open(path, LogConfig())
    messages = make_messages(body_bytes, 1000)
    for _ in range(count // 1000):
        log.append(messages, int(time.time() * 1000))
    log.sync_blocking()
    return log


def bench_read(log: SegmentLog, body_bytes: int, budget_s: float) -> dict[str, float]:
    offset = log.start_offset
    read = 0
    start = time.perf_counter()
    while offset < log.durable_next and time.perf_counter() - start < budget_s:
        batch = log.read(offset, 1000)
        read += len(batch)
        offset += len(batch)
    elapsed = time.perf_counter() - start
    return {
        "records_per_s": read / elapsed,
        "MBps": read * (50 + body_bytes) / elapsed / MIB,
        "records": read,
    }


def percentiles(samples: list[float]) -> dict[str, float]:
    samples.sort()
    return {
        "median_us": samples[len(samples) // 2] * 1e6,
        "p99_us": samples[int(len(samples) * 0.99)] * 1e6,
    }


def bench_seek(log: SegmentLog, lookups: int) -> dict[str, dict[str, float]]:
    rng = random.Random(1)
    end = log.durable_next
    by_offset: list[float] = []
    for _ in range(lookups):
        offset = rng.randrange(log.start_offset, end)
        t = time.perf_counter()
        log.read(offset, 1)
        by_offset.append(time.perf_counter() - t)
    segments = log.segments()
    first, last = segments[0].first_timestamp_ms, segments[-1].last_timestamp_ms
    by_time: list[float] = []
    for _ in range(lookups):
        target = rng.randint(first, last)
        t = time.perf_counter()
        log.seek_timestamp(target)
        by_time.append(time.perf_counter() - t)
    return {
        "read_one_at_random_offset": percentiles(by_offset),
        "seek_timestamp": percentiles(by_time),
    }


def timed(label: str, fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    result = fn()
    print(
        f"  {label:<40} {result['records_per_s']:>12,.0f} rec/s {result['MBps']:>9.1f} MB/s",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short budgets (about 20 s)")
    parser.add_argument("--dir", default=None, help="data directory (default: under .)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="log-bench-", dir=args.dir or ".")
    budget = 0.5 if args.quick else 2.0
    read_records = 200_000 if args.quick else 1_000_000
    results: dict[str, object] = {"environment": environment(base)}
    try:
        for key, value in results["environment"].items():  # type: ignore[attr-defined]
            print(f"{key}: {value}")
        disk = raw_disk(base, (64 if args.quick else 256) * MIB)
        results["disk"] = disk
        print(
            f"raw disk: {disk['raw_write_MBps']:.0f} MB/s (fsync at end), "
            f"{disk['raw_write_fsync_1MiB_MBps']:.0f} MB/s (fsync per MiB), "
            f"fdatasync {disk['fdatasync_median_us']:.0f} us median"
        )
        print("append (every case ends with a sync):")
        appends = {}
        for body in (16, KIB, 64 * KIB):
            for batch in (1, 100, 1000):
                for sync in (False, True):
                    if body == 64 * KIB and batch == 1000 and sync:
                        continue  # 64 MiB per sync: the no-sync case already shows it
                    label = f"body {body} B, batch {batch}, {'sync' if sync else 'no sync'}"
                    cap = max(2000, (2 if args.quick else 8) * 10**6 // max(1, body // 16))
                    case = (base, body, batch, sync, budget, cap)
                    appends[label] = timed(label, lambda case=case: bench_append(*case))
        results["append"] = appends
        print("sequential read (read(offset, 1000) in a loop):")
        reads = {}
        for body, count in ((16, read_records), (KIB, read_records // 4)):
            log = filled_log(base, body, count)
            case = (log, body, budget * 5)
            reads[f"body {body} B"] = timed(
                f"body {body} B, {count} records", lambda case=case: bench_read(*case)
            )
            if body == 16:
                results["seek"] = seeks = bench_seek(log, 2000 if args.quick else 10000)
                print(f"  seek over {len(log.segments())} segments of {count} records:")
                for name, p in seeks.items():
                    print(
                        f"    {name:<28} median {p['median_us']:.1f} us, p99 {p['p99_us']:.1f} us"
                    )
            log.close_blocking()
        results["read"] = reads
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
