"""Fuzz `_streamwire.chunk_run_records` and `chunk_message_spans`
(streamq/log/_streamwire_runs.c): they walk the entries of a chunk read from disk, so
every byte of them may be bit rot (or, past the CRCs, anything a writer put there). AMQP
0-9-1 consumers of every version-2 stream run the first, the Spark source the second.

An input is `entries | records | runs | runs x (first, count, length code) | entries
bytes`: the header's entry and record counts, filter value runs (a value of
2 x length code bytes, so that both sides of the 255-byte limit come up), then the
entries. The property: the C function raises nothing but ValueError, and agrees with the
Python reader it stands for (`chunk.iter_entries`, `batches.messages`,
`chunk_segment.chunk_records` then `chunk_runs.chunk_run`): ValueError exactly where the
Python path raises ChunkInvalid, None where it must take over (a value over 255 bytes, a
compressed batch met before any malformed entry), else the same records byte for byte.
The spans, which take no filter value, agree with the same reader without the runs:
ValueError where it raises, None at a compressed batch, else each record's message.

Run: pytest tests/fuzz/test_chunk_entries.py (bounded), or
python -m tests.fuzz.soak chunk_entries -runs=1000000 (atheris soak, tools/fuzz.sh).
"""

from __future__ import annotations

from typing import Final

from streamq.log import batches, chunk, frame
from streamq.log import format as fmt
from streamq.log._streamwire import chunk_message_spans, chunk_run_records
from streamq.log.chunk import ChunkHeader, ChunkInvalid
from streamq.log.chunk_runs import chunk_run
from streamq.log.chunk_segment import chunk_records
from tests.fuzz.harness import bounded_run

CORPUS: Final = "chunk_entries"
EXAMPLES: Final = 2000
FIRST: Final = 500
TIMESTAMP: Final = 1_700_000_000_000
HEAD: Final = frame.FRAME_HEAD_BYTES
RUNS_MAX: Final = 3


def parse_input(data: bytes) -> tuple[int, int, list[frame.FilterRun], bytes]:
    entries, records, count = (data + b"\0\0\0")[:3]
    runs, at = [], 3
    for _ in range(count % (RUNS_MAX + 1)):
        first, length, code = (data[at : at + 3] + b"\0\0\0")[:3]
        runs.append((first, length, b"f" * (2 * code)))
        at += 3
    return entries, records, runs, data[at:]


def python_outcome(
    entries: bytes, num_entries: int, num_records: int, runs: list[frame.FilterRun]
) -> tuple[str, bytes]:
    if any(len(value) > 255 for value in frame.filter_value_list(runs, num_entries)):
        return "none", b""  # the C function looks at the values first
    trailer = frame.encode_trailer({}, runs)
    head = chunk.HEADER.pack(chunk.MAGIC_VERSION, 0, num_entries, num_records, TIMESTAMP, 1,
                             FIRST, 0, len(entries), len(trailer), 0)  # fmt: skip
    data = bytes(HEAD) + head + entries + trailer
    header = ChunkHeader(0, num_entries, num_records, TIMESTAMP, 1, FIRST, 0, len(entries),
                         len(trailer), 0)  # fmt: skip
    records: list[fmt.Record] = []
    try:
        for entry in chunk.iter_entries(data, HEAD, header):
            if entry.batch and entry.compression:
                return "none", b""  # ... then stops at the first compressed batch
            if entry.batch:
                batches.messages(entry)
        chunk_records(data, 0, header, FIRST, num_records, records)
    except ChunkInvalid:
        return "invalid", b""
    run = chunk_run(records, FIRST, num_records)
    if run is None:  # no records at all: what the C function refuses up front
        return "invalid", b""
    return "run", run.data + run.positions.tobytes()


def c_outcome(
    entries: bytes, num_entries: int, num_records: int, runs: list[frame.FilterRun]
) -> tuple[str, bytes]:
    buffer = bytes(HEAD + chunk.HEADER_BYTES) + entries
    try:
        made = chunk_run_records(buffer, HEAD + chunk.HEADER_BYTES, len(entries), num_entries,
                                 FIRST, num_records, TIMESTAMP, runs)  # fmt: skip
    except ValueError:
        return "invalid", b""
    if made is None:
        return "none", b""
    return "run", made[0] + made[1]


def python_messages(entries: bytes, num_entries: int, num_records: int) -> tuple[str, bytes]:
    """The Python reader's messages of the chunk, each behind its u32 length."""
    header = ChunkHeader(0, num_entries, num_records, TIMESTAMP, 1, FIRST, 0, len(entries),
                         0, 0)  # fmt: skip
    data = bytes(HEAD + chunk.HEADER_BYTES) + entries
    records: list[fmt.Record] = []
    try:
        for entry in chunk.iter_entries(data, HEAD, header):
            if entry.batch and entry.compression:
                return "none", b""
            if entry.batch:
                batches.messages(entry)
        chunk_records(data, 0, header, FIRST, num_records, records)
    except ChunkInvalid:
        return "invalid", b""
    if not records:
        return "invalid", b""  # no entries: refused up front
    return "run", b"".join(len(r.body).to_bytes(4, "little") + r.body for r in records)


def c_messages(entries: bytes, num_entries: int, num_records: int) -> tuple[str, bytes]:
    buffer = bytes(HEAD + chunk.HEADER_BYTES) + entries
    try:
        spans = chunk_message_spans(buffer, HEAD + chunk.HEADER_BYTES, len(entries),
                                    num_entries, FIRST, num_records)  # fmt: skip
    except ValueError:
        return "invalid", b""
    if spans is None:
        return "none", b""
    bounds = [int.from_bytes(spans[i : i + 8], "little") for i in range(0, len(spans), 8)]
    pieces = [buffer[bounds[i] : bounds[i + 1]] for i in range(0, len(bounds), 2)]
    return "run", b"".join(len(p).to_bytes(4, "little") + p for p in pieces)


def fuzz_one(data: bytes) -> None:
    num_entries, num_records, runs, entries = parse_input(data)
    expected = python_outcome(entries, num_entries, num_records, runs)
    got = c_outcome(entries, num_entries, num_records, runs)
    assert got == expected, (got[0], expected[0])
    spans = c_messages(entries, num_entries, num_records)
    assert spans == python_messages(entries, num_entries, num_records), spans[0]


def test_chunk_entries_bounded() -> None:
    bounded_run(fuzz_one, CORPUS, EXAMPLES)
