"""Helpers of the bit-rot tests: where each record lies in a log directory's segments (read
with the format module alone), flipping bits in real files, and the damage the broker
reports (`damaged_messages` in /api/queues, `streamq_damaged_records_total` in /metrics)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

from streamq.log import amqp10, chunk, frame
from streamq.log import format as fmt
from tests.integration.conftest import RunningBroker


class RecordSpan(NamedTuple):
    path: Path  # the segment file
    position: int
    end: int  # one past its last byte
    offset: int
    body: bytes


def record_spans(log_dir: Path) -> list[RecordSpan]:
    """Every record of the log in `log_dir`, oldest first, from its segments' bytes: in a
    version-2 segment, each simple entry of its chunks (the span of its bytes, the body
    an AMQP 0-9-1 consumer gets)."""
    spans = []
    for path in sorted(log_dir.glob("*" + fmt.SEGMENT_SUFFIX)):
        data = path.read_bytes()
        base = fmt.decode_segment_header(data, str(path))
        if fmt.decode_segment_version(data) == frame.FORMAT_VERSION:
            spans += _entry_spans(path, data)
            continue
        records: list[fmt.Record] = []
        position = fmt.SEGMENT_HEADER_BYTES
        while position < len(data):
            before = len(records)
            result = fmt.decode_records(data, 0, position, base, 1 << 62, records, 1, str(path))
            if len(records) == before:
                break  # the end (a clean close leaves no padding)
            record = records[-1]
            spans.append(RecordSpan(path, position, result.position, record.offset, record.body))
            position, base = result.position, record.offset + 1
    return spans


def _entry_spans(path: Path, data: bytes) -> list[RecordSpan]:
    spans = []
    for chunk_span in chunk_spans_of(path, data):
        header = chunk.decode_header(data, chunk_span.position + frame.FRAME_HEAD_BYTES)
        at = chunk_span.entries_at
        for entry in chunk.iter_entries(data, chunk_span.position + frame.FRAME_HEAD_BYTES, header):
            assert not entry.batch, "a sub-entry batch: not a record of its own"
            record = fmt.Record(entry.offset, 0, b"", b"", amqp10.native_properties(0),
                                bytes(entry.data))  # fmt: skip
            body = amqp10.to_amqp091("", record)[3]
            end = at + 4 + len(entry.data)
            spans.append(RecordSpan(path, at, end, entry.offset, body))
            at = end
    return spans


class ChunkSpan(NamedTuple):
    path: Path  # the version-2 segment file
    position: int  # of the frame
    end: int  # one past its last byte
    first_offset: int
    records: int
    entries_at: int  # where its entries start in the file
    entries_bytes: int


def chunk_spans(log_dir: Path) -> list[ChunkSpan]:
    """Every chunk of the version-2 segments of the log in `log_dir`, oldest first, from
    the segments' bytes (`frame` alone)."""
    spans = []
    for path in sorted(log_dir.glob("*" + fmt.SEGMENT_SUFFIX)):
        data = path.read_bytes()
        fmt.decode_segment_header(data, str(path))
        if fmt.decode_segment_version(data) == frame.FORMAT_VERSION:
            spans += chunk_spans_of(path, data)
    return spans


def chunk_spans_of(path: Path, data: bytes) -> list[ChunkSpan]:
    """The chunks of the version-2 segment `path` whose bytes are `data`."""
    spans = []
    position = fmt.SEGMENT_HEADER_BYTES
    while position < len(data):
        try:
            header = frame.check_frame(data, position)
        except chunk.ChunkInvalid:
            break  # the end (a clean close leaves no padding)
        at = position + frame.FRAME_HEAD_BYTES + chunk.HEADER_BYTES + header.bloom_size
        end = position + frame.frame_bytes(header)
        spans.append(ChunkSpan(path, position, end, header.first_offset,
                               header.num_records, at, header.data_length))  # fmt: skip
        position = end
    return spans


def flip_in_chunk(span: ChunkSpan) -> None:
    """Flip a bit in the middle of the chunk's entries (its CRC32 then fails)."""
    flip_bit(span.path, (span.entries_at + span.entries_bytes // 2) * 8 + 3)


def flip_bit(path: Path, bit: int) -> None:
    """Flip one bit of the file in place (the file's real bytes on disk)."""
    with open(path, "r+b") as f:
        f.seek(bit // 8)
        byte = f.read(1)[0]
        f.seek(bit // 8)
        f.write(bytes([byte ^ (1 << (bit % 8))]))


def flip_in_body(span: RecordSpan) -> None:
    """Flip a bit in the middle of the record's body."""
    middle = span.end - max(1, len(span.body) // 2)
    flip_bit(span.path, middle * 8 + 3)


def damaged_messages(broker: RunningBroker, queue: str, vhost: str = "%2F") -> int:
    status, body, _ = broker.http("GET", f"/api/queues/{vhost}/{queue}")
    assert status == 200 and isinstance(body, dict), (status, body)
    return int(body["damaged_messages"])


def damaged_metric(broker: RunningBroker, vhost: str = "/") -> int:
    status, text, _ = broker.http("GET", "/metrics")
    assert status == 200 and isinstance(text, str)
    found = re.search(rf'^streamq_damaged_records_total{{vhost="{re.escape(vhost)}"}} (\d+)$',
                      text, re.MULTILINE)  # fmt: skip
    assert found is not None, "no streamq_damaged_records_total for the vhost"
    return int(found.group(1))


def messages_dir(data_dir: Path) -> Path:
    [directory] = list((data_dir / "vhosts").glob("*/messages"))
    return directory


def stream_dir(data_dir: Path) -> Path:
    [directory] = [p for p in (data_dir / "vhosts").glob("*/streams/*") if p.is_dir()]
    return directory
