"""The cost of `SegmentLog.read_at` with many small write buffers kept in memory.

Traffic made of single small publishes (a Celery worker's, say) flushes each publish as its
own write, so the log keeps tens of thousands of small buffers for `read_at` (up to the
vhost's `recent_bytes_max`, 32 MiB). This appends N 16 B records, flushing each as its own
write, then times `read_at` of the last 2,000 of them.

    .venv/bin/python benchmarks/recent_reads.py 1000 20000
"""

from __future__ import annotations

import argparse
import tempfile
import time

from streamq.log.log import LogConfig, SegmentLog

READS: int = 2000


def measure(buffers: int) -> float:
    """Microseconds per read_at with `buffers` kept buffers."""
    with tempfile.TemporaryDirectory() as directory:
        log = SegmentLog.open(
            directory, LogConfig(recent_bytes_max=32 << 20, segment_bytes_max=256 << 20)
        )
        where = []
        for _ in range(buffers):
            offset = log.append_one(b"", b"q", b"", b"x" * 16, 0)
            log._flush(log._active)  # one write per publish, as single publishes make
            where.append(log.locate(offset))
        log.sync_blocking()
        started = time.perf_counter()
        for base, position, _ in where[-READS:]:
            log.read_at(base, position, 4096)
        elapsed = time.perf_counter() - started
        log.close_blocking()
    return elapsed / min(READS, buffers) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("buffers", type=int, nargs="+")
    for buffers in parser.parse_args().buffers:
        print(f"{buffers} kept buffers: {measure(buffers):.1f} us per read_at")


if __name__ == "__main__":
    main()
