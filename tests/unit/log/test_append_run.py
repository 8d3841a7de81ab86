"""`SegmentLog.append_run` writes exactly what `append_one` writes for the same messages.

Method: two logs with small segments, index intervals and write buffers get the same
messages, one through runs of random lengths and one message at a time; their segment
files, index files and segment metadata must be byte-for-byte equal, and every record
must read back. Runs cross index entries, segment rolls and buffer flushes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from streamq.log.log import LogConfig, RunMessage, SegmentLog

CONFIG = LogConfig(segment_bytes_max=4096, index_interval_bytes=300, write_buffer_bytes_max=700)

properties = st.binary(min_size=2, max_size=40)
bodies = st.binary(max_size=1500)
runs = st.lists(
    st.tuples(
        st.sampled_from([b"", b"amq.direct", b"x" * 255]),
        st.sampled_from([b"", b"key", b"k" * 200]),
        st.lists(st.tuples(properties, bodies), min_size=1, max_size=30),
    ),
    min_size=1,
    max_size=8,
)


def files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@settings(max_examples=60, deadline=None)
@given(runs=runs, timestamp_ms=st.integers(0, 2**40))
def test_append_run_matches_append_one(
    runs: list[tuple[bytes, bytes, list[tuple[bytes, bytes]]]], timestamp_ms: int
) -> None:
    with tempfile.TemporaryDirectory() as root:
        one_dir, run_dir = Path(root, "one"), Path(root, "run")
        by_one = SegmentLog.open(str(one_dir), CONFIG)
        by_run = SegmentLog.open(str(run_dir), CONFIG)
        expected = []
        for exchange, routing_key, pairs in runs:
            messages: list[RunMessage] = [(p, b, "ignored", "ignored", 0) for p, b in pairs]
            first = by_run.append_run(exchange, routing_key, messages, timestamp_ms)
            offsets = [
                by_one.append_one(exchange, routing_key, p, b, timestamp_ms) for p, b in pairs
            ]
            assert offsets == list(range(first, first + len(pairs)))
            expected += [(exchange, routing_key, p, b) for p, b in pairs]
        by_one.sync_blocking()
        by_run.sync_blocking()
        assert by_run.segments() == by_one.segments()
        records = by_run.read(0, len(expected) + 1)
        assert [(r.exchange, r.routing_key, r.properties, r.body) for r in records] == expected
        by_one.close_blocking()
        by_run.close_blocking()
        assert files(run_dir) == files(one_dir)


def test_a_run_keeps_the_log_clock_from_going_back(tmp_path: Path) -> None:
    log = SegmentLog.open(str(tmp_path), CONFIG)
    log.append_one(b"", b"q", b"\x00\x00", b"a", 5000)
    first = log.append_run(b"", b"q", [(b"\x00\x00", b"b", "", "q", 0)], 1000)
    log.sync_blocking()
    [record] = log.read(first, 1)
    assert record.timestamp_ms == 5000
    log.close_blocking()
