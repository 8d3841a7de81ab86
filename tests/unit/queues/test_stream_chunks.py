"""A stream stored in chunks (segment format version 2): Publish frames as entries (batches
kept compressed), deduplication through the trailers across a restart, AMQP 0-9-1
publishes converted to AMQP 1.0, stored chunks for stream consumers (exact filters), and
the records AMQP readers get."""

from __future__ import annotations

import os
import struct

import pytest
from rstream import schema

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from retention.rules import RetentionRules
from streamq.log import amqp10, chunk, frame
from streamq.log.format import Record
from streamq.log.log import LogConfig, SegmentLog
from streamq.queues import sub_entries
from streamq.queues.chunks import CHUNK_HEADER, ChunkFilter
from streamq.queues.offsets import OffsetStore
from streamq.queues.publishers import BadPublish
from streamq.queues.stream import StreamQueue
from tests.unit.queues import test_stream_native as stream_native
from tests.unit.queues.test_stream_native import bad_payloads, ids, message, payload

BODY = b"0123456789abcdef"


def open_stream(directory: str, record_bytes_max: int = 128 << 20) -> StreamQueue:
    config = LogConfig(
        segment_bytes_max=64 * 1024, format_version=2, record_bytes_max=record_bytes_max
    )
    log = SegmentLog.open(os.path.join(directory, "log"), config)
    return StreamQueue(log, RetentionRules(), OffsetStore.open(os.path.join(directory, "off")))


def close(stream: StreamQueue) -> None:
    stream.log.close_blocking()
    stream.publishers.close()
    stream.offsets.close()


def deliver(stream: StreamQueue, offset: int, flt: ChunkFilter | None = None) -> list[bytes]:
    """The messages of the chunk a stream consumer gets at `offset`, as rstream's Deliver
    parses them (it checks the lengths, the type and the CRC)."""
    got = stream.read_chunk(offset, 8192, 1 << 20, flt)
    assert got is not None and got.records
    data = bytes(got.data)
    fields = CHUNK_HEADER.unpack_from(data, 0)
    parsed = schema.Deliver(1, *fields, data=data[CHUNK_HEADER.size :])
    return list(parsed.get_messages())


def test_publish_stores_entries_as_sent_and_reads_them_as_records(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    assert stream.append_publish(b"p", 1, payload(message(1), message(2, b"")), 1000) == (
        2, 2, 2, ids(1, 2),
    )  # fmt: skip
    second = stream.append_publish(
        b"", 2, payload(message(7, b"x", b"eu"), message(7, b"y", v2=True)), 1000
    )
    assert second == (2, 2, 4, ids(7, 7))
    stream.log.sync_blocking()
    records = stream.log.read(0, 10)
    assert [(r.offset, r.routing_key, r.body) for r in records] == [
        (0, b"", BODY), (1, b"", b""), (2, b"eu", b"x"), (3, b"", b"y"),
    ]  # fmt: skip
    assert all(amqp10.is_native(r.properties) for r in records)
    assert deliver(stream, 0) == [BODY, b"", b"x", b"y"]
    assert deliver(stream, 3) == [BODY, b"", b"x", b"y"]  # the whole chunk, as RabbitMQ
    close(stream)


def test_stored_chunks_are_the_same_bytes_on_every_read(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    for i in range(3):
        stream.append_publish(b"p", 1, payload(*(message(i * 10 + n) for n in range(5))), i)
        stream.log.sync_blocking()
    reads = [[bytes(stream.read_chunk(o, 10, 1 << 20).data) for o in (0, 5, 10)] for _ in "ab"]
    assert reads[0] == reads[1]
    headers = [chunk.decode_header(data) for data in reads[0]]
    assert [(h.first_offset, h.num_records, h.epoch) for h in headers] == [
        (0, 5, 1), (5, 5, 1), (10, 5, 1),
    ]  # fmt: skip
    close(stream)


def test_duplicates_are_skipped_and_the_sequence_survives_a_restart(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = open_stream(str(tmp_path))
    stream.append_publish(b"a", 1, payload(message(1), message(2), message(3)), 1000)
    result = stream.append_publish(b"a", 1, payload(message(2), message(4), message(4)), 1000)
    assert result == (3, 1, 5 - 1, ids(2, 4, 4))
    stream.log.sync_blocking()
    close(stream)
    # The publishers file lost: the trailers alone give the sequence back.
    os.remove(os.path.join(str(tmp_path), "log", "publishers"))
    with monkeypatch.context() as patch:  # no record is read: a 10M-record stream took 32 s
        patch.setattr(SegmentLog, "read", None)
        reopened = open_stream(str(tmp_path))
    assert reopened.publishers.sequence(b"a") == 4
    assert reopened.append_publish(b"a", 1, payload(message(4)), 1000).appended == 0
    assert reopened.append_publish(b"a", 1, payload(message(5)), 1000).appended == 1
    close(reopened)


@pytest.mark.parametrize("compression", [1, 2, 3, 4])
def test_compressed_batches_are_kept_compressed(tmp_path: str, compression: int) -> None:
    stream = open_stream(str(tmp_path))
    inner = [b"one", b"two!", b"", BODY * 20]
    batch = struct.pack(">Q", 9) + sub_entries.compress(compression, inner)
    assert stream.append_publish(b"r", 1, struct.pack(">I", 1) + batch, 1000) == (1, 4, 4, ids(9))
    stream.log.sync_blocking()
    assert [r.body for r in stream.log.read(0, 10)] == inner
    got = stream.read_chunk(0, 10, 1 << 20)
    assert got is not None and batch[8:] in bytes(got.data)  # as the producer sent it
    close(stream)


def test_a_batch_that_does_not_decompress_is_refused(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    bad = struct.pack(">QBHII", 1, 0x90, 1, 5, 5) + struct.pack(">I", 1) + b"x"
    with pytest.raises(BadPublish, match="gzip sub-entry batch does not decompress"):
        stream.append_publish(b"r", 1, struct.pack(">I", 1) + bad, 1000)
    assert stream.log.next_offset == 0
    close(stream)


@pytest.mark.parametrize(
    ("version", "data", "reason"),
    [case for case in bad_payloads() if "255" not in case[2]],
)
def test_malformed_publish_appends_nothing(
    tmp_path: str, version: int, data: bytes, reason: str
) -> None:
    stream = open_stream(str(tmp_path), record_bytes_max=1024)
    stream.append_publish(b"r", 1, payload(message(1)), 1000)
    with pytest.raises(BadPublish) as caught:
        stream.append_publish(b"r2", version, data, 1000)
    assert reason in str(caught.value)
    assert stream.log.next_offset == 1
    close(stream)


def test_filter_values_up_to_the_protocol_limit(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    value = b"v" * 32767
    stream.append_publish(b"", 2, payload(message(1, b"x", value)), 1000)
    stream.log.sync_blocking()
    assert stream.log.read(0, 1)[0].routing_key == value
    close(stream)


def test_filters_are_exact_per_entry(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    values = [b"eu", b"us", b"eu", b"eu", None, b"us"]
    stream.append_publish(
        b"", 2, payload(*(message(i, b"m%d" % i, v, v2=True) for i, v in enumerate(values))), 1
    )
    stream.log.sync_blocking()
    eu = ChunkFilter(frozenset({b"eu"}), False)
    runs = []
    offset = 0
    while (got := stream.read_chunk(offset, 100, 1 << 20, eu)) is not None:
        if got.records:
            runs.append((got.first_offset, got.records))
        offset = got.next_offset
    assert runs == [(0, 1), (2, 2)]
    assert deliver(stream, 2, eu) == [b"m2", b"m3"]
    both = ChunkFilter(frozenset({b"eu", b"us"}), True)
    assert deliver(stream, 0, both) == [b"m%d" % i for i in range(6)]  # as stored
    close(stream)


def test_amqp_091_publishes_are_stored_as_amqp_10(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    properties = encode_properties(
        BasicProperties(content_type="text/plain", headers={"x-stream-filter-value": "eu"})
    )
    stream.append(b"amq.direct", b"key", properties, b"hello", 1000)
    stream.log.sync_blocking()
    [record] = stream.log.read(0, 1)
    assert amqp10.is_native(record.properties) and record.routing_key == b"eu"
    assert record.body == amqp10.to_amqp10(b"amq.direct", b"key", properties, b"hello")
    exchange, routing_key, _props, body = amqp10.to_amqp091("s", record)
    assert (exchange, routing_key, body) == (b"amq.direct", b"key", b"hello")
    close(stream)


def test_frame_constants() -> None:
    assert frame.FRAME_HEAD_BYTES == 8 and frame.INDEX_ENTRY_BYTES == 32


def test_a_publish_is_split_at_the_chunk_limit_with_its_filter_values(tmp_path: str) -> None:
    config = LogConfig(format_version=2, chunk_data_bytes_max=1000)
    log = SegmentLog.open(os.path.join(str(tmp_path), "log"), config)
    stream = StreamQueue(log, RetentionRules(), OffsetStore.open(os.path.join(tmp_path, "o")))
    values = [b"a"] * 7 + [b"b"] * 9 + [None] * 4 + [b"a"] * 5
    frame_ = payload(*(message(i, b"%04d" % i * 24, v, v2=True) for i, v in enumerate(values)))
    assert stream.append_publish(b"r", 2, frame_, 1).appended == 25
    stream.log.sync_blocking()
    records = stream.log.read(0, 100)
    assert [r.routing_key for r in records] == [v or b"" for v in values]
    assert [r.body for r in records] == [b"%04d" % i * 24 for i in range(25)]
    sizes = []
    offset = 0
    while (got := stream.read_chunk(offset, 100, 1 << 20)) is not None:
        sizes.append(got.records)
        offset = got.next_offset
    assert sizes == [10, 10, 5]  # 100-byte entries, 1000 bytes a chunk
    b_only = ChunkFilter(frozenset({b"b"}), False)
    assert deliver(stream, 7, b_only) == [b"%04d" % i * 24 for i in range(7, 10)]
    assert deliver(stream, 10, b_only) == [b"%04d" % i * 24 for i in range(10, 16)]
    close(stream)


def test_an_upgraded_streams_sequences_come_back_from_both_formats(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version-1 records are read for their publishing ids, version-2 chunks are not."""
    old = stream_native.open_stream(str(tmp_path))  # format version 1
    old.append_publish(b"a", 1, payload(message(1), message(2), message(3)), 1000)
    old.append_publish(b"c", 1, payload(message(9)), 1000)
    old.log.sync_blocking()
    close(old)
    stream = open_stream(str(tmp_path))
    stream.append_publish(b"b", 1, payload(message(7)), 1000)
    stream.append_publish(b"a", 1, payload(message(5)), 1000)
    stream.log.sync_blocking()
    close(stream)
    os.remove(os.path.join(str(tmp_path), "log", "publishers"))
    read: list[int] = []
    real_read = SegmentLog.read

    def counted(log: SegmentLog, offset: int, records_max: int) -> list[Record]:
        records = real_read(log, offset, records_max)
        read.extend(r.offset for r in records)
        return records

    with monkeypatch.context() as patch:
        patch.setattr(SegmentLog, "read", counted)
        reopened = open_stream(str(tmp_path))
    assert read == [0, 1, 2, 3]  # the version-1 records, not the two chunks after them
    sequences = {ref: reopened.publishers.sequence(ref) for ref in (b"a", b"b", b"c")}
    assert sequences == {b"a": 5, b"b": 7, b"c": 9}
    assert reopened.append_publish(b"a", 1, payload(message(5)), 1000).appended == 0
    close(reopened)
