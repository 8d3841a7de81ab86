"""Reads of a consumer that is behind the writers, by how far: what the page cache decision
of docs/durability.md ("The page cache") was measured with.

For each distance D (MiB): a fresh stream gets D MiB of 1 KiB messages under confirms
(benchmarks/stream_client.py), then one consumer reads it from first at once (it was
behind by D when it started), then the stream's segment files are dropped from the page
cache (posix_fadvise DONTNEED, what a consumer behind by more than the memory the cache
has meets) and it is read from first again. The client counts records from chunk
headers; the rates are the broker's.

    PYTHONPATH=. python benchmarks/stream_lag.py --behind 64,1024
    PYTHONPATH=. python benchmarks/stream_lag.py --behind 64 --streamq-flag=--no-direct-io

It starts `streamq serve` from the tree it runs in, on a free loopback port with a fresh
data directory under --dir (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Final

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.stream_client import StreamClient, amqp10_data
from tests.integration.broker_process import BrokerProcess
from tests.page_cache import resident_fraction
from tests.ports import free_port

BODY_BYTES: Final = 1024
BATCH: Final = 100
WINDOW: Final = 10_000
CREDIT: Final = 10


def evict(data_dir: Path) -> tuple[int, int]:
    """Drop every stream segment of `data_dir` from the page cache: (their bytes, the
    bytes still cached after: pages the broker has mapped stay)."""
    dropped = kept = 0
    for root, _, names in os.walk(data_dir):
        if f"{os.sep}streams{os.sep}" not in root + os.sep:
            continue
        for name in names:
            path = os.path.join(root, name)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)  # clean pages only are dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                dropped += os.fstat(fd).st_size
            finally:
                os.close(fd)
            kept += round(resident_fraction(path) * os.path.getsize(path))
    return dropped, kept


async def one_distance(port: int, data_dir: Path, mib: int) -> dict[str, float]:
    count = mib * (1 << 20) // BODY_BYTES // BATCH * BATCH
    stream = f"lag-{mib}"
    client = await StreamClient.connect("127.0.0.1", port)
    try:
        await client.create(stream)
        started = time.perf_counter()
        await client.publish(stream, amqp10_data(b"x" * BODY_BYTES), count, BATCH, WINDOW)
        publish_s = time.perf_counter() - started
        started = time.perf_counter()
        await client.consume(stream, count, CREDIT)
        behind_s = time.perf_counter() - started
        evicted, kept = evict(data_dir)
        started = time.perf_counter()
        await client.consume(stream, count, CREDIT)
        cold_s = time.perf_counter() - started
        await client.delete(stream)
    finally:
        await client.close()
    mb = count * BODY_BYTES / 1e6
    return {
        "messages": count,
        "publish MB/s": mb / publish_s,
        "behind MB/s": mb / behind_s,
        "evicted MiB": evicted / (1 << 20),
        "kept MiB": kept / (1 << 20),
        "cold MB/s": mb / cold_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--behind", default="64,1024", help="distances in MiB, comma-separated")
    parser.add_argument("--dir", type=Path, help="where the data directory goes")
    parser.add_argument("--streamq-flag", action="append", default=[], help="one more flag")
    args = parser.parse_args()
    distances = [int(part) for part in args.behind.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        data_dir = Path(directory) / "data"
        port = free_port()
        broker = BrokerProcess(data_dir, "--stream-port", str(port), *args.streamq_flag)
        # Its log goes on after the `listening` line: drained, so the pipe never fills.
        stderr = broker.process.stderr
        threading.Thread(target=lambda: stderr and stderr.read(), daemon=True).start()
        try:
            print("| behind | messages | publish MB/s | read, behind | read, evicted |")
            print("|---|---|---|---|---|")
            for mib in distances:
                row = uvloop.run(one_distance(port, data_dir, mib))
                print(
                    f"| {mib} MiB | {row['messages']:,.0f} | {row['publish MB/s']:,.0f} | "
                    f"{row['behind MB/s']:,.0f} MB/s | {row['cold MB/s']:,.0f} MB/s "
                    f"({row['evicted MiB']:,.0f} MiB dropped, {row['kept MiB']:,.0f} MiB stayed) |",
                    flush=True,
                )
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
