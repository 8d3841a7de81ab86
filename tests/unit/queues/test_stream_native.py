"""Stream-native storage: Publish frames into records, publisher deduplication that
survives restarts and crashes, and osiris chunks as rstream parses them (with filters)."""

from __future__ import annotations

import os
import shutil
import struct

import pytest
from rstream import schema

from amqp_gateway.codec.properties import BasicProperties, encode_properties
from retention.rules import RetentionRules
from streamq.log import amqp10
from streamq.log import format as fmt
from streamq.log.log import LogConfig, SegmentLog
from streamq.queues import publishers as publishers_module
from streamq.queues.chunks import CHUNK_HEADER, Chunk, ChunkFilter
from streamq.queues.offsets import OffsetStore
from streamq.queues.publishers import NO_SEQUENCE, BadPublish, PublishersCorrupted
from streamq.queues.stream import StreamQueue

BODY = b"0123456789abcdef"


def open_stream(directory: str, segment_bytes_max: int = 64 * 1024) -> StreamQueue:
    log = SegmentLog.open(
        os.path.join(directory, "log"), LogConfig(segment_bytes_max=segment_bytes_max)
    )
    return StreamQueue(log, RetentionRules(), OffsetStore.open(os.path.join(directory, "off")))


def close(stream: StreamQueue) -> None:
    stream.log.close_blocking()
    stream.publishers.close()
    stream.offsets.close()


def message(
    publishing_id: int, body: bytes = BODY, filter_value: bytes | None = None, v2: bool = False
) -> bytes:
    """A Publish message; v1 unless a filter value is given or v2 (None: length -1)."""
    head = struct.pack(">Q", publishing_id)
    if filter_value is not None:
        head += struct.pack(">h", len(filter_value)) + filter_value
    elif v2:
        head += struct.pack(">h", -1)
    return head + struct.pack(">I", len(body)) + body


def payload(*messages: bytes) -> bytes:
    return struct.pack(">I", len(messages)) + b"".join(messages)


def ids(*values: int) -> bytes:
    return b"".join(struct.pack(">Q", v) for v in values)


def publish(
    stream: StreamQueue, reference: bytes, first: int, count: int, version: int = 1
) -> None:
    fv = b"f" if version == 2 else None
    body = payload(*(message(i, BODY, fv) for i in range(first, first + count)))
    stream.append_publish(reference, version, body, 1000)


# -- publish ----------------------------------------------------------------------------


def test_publish_v1_and_v2_store_native_records(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    first = stream.append_publish(b"p", 1, payload(message(1), message(2, b"")), 1000)
    assert first == (2, 2, 2, ids(1, 2))
    second = stream.append_publish(
        b"", 2, payload(message(7, b"x", b"eu"), message(7, b"y", v2=True)), 1000
    )
    assert second == (2, 2, 4, ids(7, 7))  # no reference: no deduplication
    assert stream.log.read(0, 10) == []  # durable (readable) after the sync round only
    stream.log.sync_blocking()
    records = stream.log.read(0, 10)
    assert [(r.offset, r.exchange, r.routing_key, r.body) for r in records] == [
        (0, b"p", b"", BODY),
        (1, b"p", b"", b""),
        (2, b"", b"eu", b"x"),
        (3, b"", b"", b"y"),
    ]
    assert [r.properties for r in records] == [amqp10.native_properties(i) for i in (1, 2, 7, 7)]
    assert stream.publishers.sequence(b"p") == 2
    assert stream.publishers.sequence(b"") == NO_SEQUENCE
    close(stream)


def test_duplicates_are_confirmed_not_stored_per_reference(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    stream.append_publish(b"a", 1, payload(message(1), message(2), message(3)), 1000)
    stream.append_publish(b"b", 1, payload(message(1)), 1000)
    # Ids at or below the reference's sequence, and repeats within the frame, are skipped.
    result = stream.append_publish(b"a", 1, payload(message(2), message(4), message(4)), 1000)
    assert result == (3, 1, 5, ids(2, 4, 4))
    assert stream.append_publish(b"a", 1, payload(message(3)), 1000) == (1, 0, 5, ids(3))
    assert (stream.publishers.sequence(b"a"), stream.publishers.sequence(b"b")) == (4, 1)
    stream.log.sync_blocking()
    stored = [(b"a", 1), (b"a", 2), (b"a", 3), (b"b", 1), (b"a", 4)]
    assert [(r.exchange, r.properties) for r in stream.log.read(0, 10)] == [
        (ref, amqp10.native_properties(i)) for ref, i in stored
    ]
    close(stream)


def test_a_new_references_publishing_id_0_is_stored(tmp_path: str) -> None:
    """RabbitMQ stores ids 0, 1, 2 of a new reference (issue 29): 0 is no duplicate
    until the reference stored it; then it is, after a restart too."""
    stream = open_stream(str(tmp_path))
    assert stream.publishers.sequence(b"new") == NO_SEQUENCE
    result = stream.append_publish(b"new", 1, payload(message(0)), 1000)
    assert (result.count, result.appended) == (1, 1)
    assert stream.publishers.sequence(b"new") == 0
    again = stream.append_publish(b"new", 1, payload(message(0), message(1), message(2)), 1000)
    assert (again.count, again.appended) == (3, 2)
    stream.log.sync_blocking()
    close(stream)
    reopened = open_stream(str(tmp_path))
    assert reopened.publishers.sequence(b"new") == 2
    assert reopened.append_publish(b"new", 1, payload(message(0)), 1000).appended == 0
    assert reopened.append_publish(b"other", 1, payload(message(0)), 1000).appended == 1
    close(reopened)


def test_a_reference_stored_with_sequence_0_still_dedups_0_after_restart(
    tmp_path: str,
) -> None:
    stream = open_stream(str(tmp_path))
    stream.append_publish(b"zero", 1, payload(message(0)), 1000)
    stream.log.sync_blocking()
    close(stream)
    reopened = open_stream(str(tmp_path))
    assert reopened.publishers.references() == {b"zero": 0}
    assert reopened.append_publish(b"zero", 1, payload(message(0)), 1000).appended == 0
    assert reopened.append_publish(b"zero", 1, payload(message(1)), 1000).appended == 1
    close(reopened)


def test_uncompressed_sub_entry_batch_is_one_record_per_message(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    inner = [b"one", b"two!", b""]
    data = b"".join(struct.pack(">I", len(m)) + m for m in inner)
    batch = struct.pack(">QBHII", 9, 0x80, len(inner), len(data), len(data)) + data
    assert stream.append_publish(b"r", 1, struct.pack(">I", 1) + batch, 1000) == (1, 3, 3, ids(9))
    stream.log.sync_blocking()
    assert [(r.body, r.properties) for r in stream.log.read(0, 10)] == [
        (m, amqp10.native_properties(9)) for m in inner
    ]
    close(stream)


def bad_payloads() -> list[tuple[int, bytes, str]]:
    good = payload(message(1, b"abc", b"f"), message(2, b"de", v2=True))
    cut = [(2, good[:n], "truncated") for n in range(len(good))]
    batch = struct.pack(">QBHII", 1, 0x90, 1, 5, 5) + struct.pack(">I", 1) + b"x"
    return [
        *cut,
        (2, good + b"\x00", "bytes after the last message"),
        (1, struct.pack(">i", -1), "negative message count"),
        (2, payload(struct.pack(">Qh", 1, -2)), "negative filter value length"),
        (2, payload(message(1, b"", b"v" * 256)), "longer than 255"),
        (1, struct.pack(">I", 1) + batch, "gzip sub-entry batch does not decompress"),
        (3, payload(message(1)), "unsupported Publish version"),
        (1, payload(message(1, b"x" * 2000)), "record size limit"),
    ]


@pytest.mark.parametrize(("version", "data", "reason"), bad_payloads())
def test_malformed_publish_appends_nothing(
    tmp_path: str, version: int, data: bytes, reason: str
) -> None:
    log = SegmentLog.open(os.path.join(str(tmp_path), "log"), LogConfig(record_bytes_max=1024))
    stream = StreamQueue(log, RetentionRules(), OffsetStore.open(os.path.join(tmp_path, "o")))
    stream.append_publish(b"r", 1, payload(message(1)), 1000)
    with pytest.raises(BadPublish) as caught:
        stream.append_publish(b"r2", version, data, 1000)
    assert reason in str(caught.value) or (
        reason == "truncated" and "truncated" in str(caught.value)
    )
    assert isinstance(caught.value, ValueError)
    assert (log.next_offset, stream.publishers.sequence(b"r2")) == (1, NO_SEQUENCE)
    close(stream)


def test_reference_over_255_bytes_is_refused(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    with pytest.raises(BadPublish, match="reference"):
        stream.append_publish(b"r" * 256, 1, payload(message(1)), 1000)
    close(stream)


def test_append_publish_rolls_segments_and_indexes_like_append(tmp_path: str) -> None:
    """Frames larger than the index interval and the segment: the log's index and
    segments are as if each record went through `append`; reads by offset find them."""
    stream = open_stream(str(tmp_path), segment_bytes_max=16 * 1024)
    for frame in range(20):
        publish(stream, b"r", 1 + frame * 150, 150, version=2)
    stream.log.sync_blocking()
    log = stream.log
    assert log.next_offset == 3000 and log.segment_count > 10
    for offset in (0, 1, 299, 1500, 2999):
        record = log.read_record(offset)
        assert record.properties == amqp10.native_properties(offset + 1)
    assert [r.offset for r in log.read(1234, 5)] == [1234, 1235, 1236, 1237, 1238]
    close(stream)
    reopened = open_stream(str(tmp_path), segment_bytes_max=16 * 1024)  # recovery agrees
    assert reopened.log.next_offset == 3000
    assert reopened.publishers.sequence(b"r") == 3000
    close(reopened)


# -- publisher sequences: durability ------------------------------------------------------


def test_sequences_survive_close_and_reopen(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    publish(stream, b"a", 1, 10)
    publish(stream, b"b", 5, 3, version=2)
    publish(stream, b"", 100, 3)
    stream.log.sync_blocking()
    close(stream)
    stream = open_stream(str(tmp_path))
    assert stream.publishers.references() == {b"a": 10, b"b": 7}
    assert stream.append_publish(b"a", 1, payload(message(10), message(11)), 1000).appended == 1
    close(stream)


def test_sequences_rebuilt_from_records_after_the_snapshot(tmp_path: str) -> None:
    """A crash after the log's records were durable but before the publishers file got
    its write: reopened, the state comes from the file plus a scan of the records."""
    stream = open_stream(str(tmp_path))
    path = os.path.join(str(tmp_path), "log", publishers_module.FILE_NAME)
    publish(stream, b"a", 1, 5)
    stream.log.sync_blocking()
    shutil.copy(path, path + ".old")
    publish(stream, b"a", 6, 5)
    publish(stream, b"c", 1, 2)
    stream.append(b"ex", b"rk", b"\x00\x00", b"amqp", 1000)  # a 0-9-1 record is passed over
    stream.log.sync_blocking()
    close(stream)
    os.replace(path + ".old", path)
    stream = open_stream(str(tmp_path))
    assert stream.publishers.references() == {b"a": 10, b"c": 2}
    assert stream.append_publish(b"a", 1, payload(message(10)), 1000).appended == 0
    close(stream)


def test_publishers_file_ahead_of_the_log_is_not_trusted(tmp_path: str) -> None:
    """The file counts records the log lost (written, then the segment's data did not
    reach the disk): the ids of lost records must not make retries duplicates."""
    stream = open_stream(str(tmp_path))
    publish(stream, b"a", 1, 5)
    publish(stream, b"b", 1, 3)
    stream.log.sync_blocking()
    close(stream)
    path = os.path.join(str(tmp_path), "log", publishers_module.FILE_NAME)
    entries = {
        b"a": publishers_module.Entry(50, 100),  # its record (offset 100) was lost
        b"b": publishers_module.Entry(3, 7),  # still there
        b"z": publishers_module.Entry(9, 120),  # lost, and no record of it is left
    }
    with open(path, "wb") as file:
        file.write(publishers_module.encode_file(121, entries))
    stream = open_stream(str(tmp_path))
    assert stream.publishers.references() == {b"a": 5, b"b": 3}
    close(stream)


def test_torn_tail_is_cut_and_damage_before_it_raises(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    publish(stream, b"a", 1, 2)
    stream.log.sync_blocking()
    publish(stream, b"b", 1, 2)
    stream.log.sync_blocking()
    close(stream)
    path = os.path.join(str(tmp_path), "log", publishers_module.FILE_NAME)
    with open(path, "rb") as file:
        data = file.read()
    with open(path, "wb") as file:
        file.write(data[:-3])  # the last record torn: its reference comes from the scan
    stream = open_stream(str(tmp_path))
    assert stream.publishers.references() == {b"a": 2, b"b": 2}
    close(stream)
    with open(path, "rb") as file:
        data = bytearray(file.read())
    data[publishers_module.HEADER.size + 9] ^= 0xFF  # the first record's payload
    with open(path, "wb") as file:
        file.write(bytes(data) + publishers_module.encode_record(0, b"x", 1, 0))
    with pytest.raises(PublishersCorrupted, match="checksum"):
        open_stream(str(tmp_path))


def test_many_rounds_compact_the_file(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publishers_module, "COMPACT_RECORDS_MIN", 4)
    stream = open_stream(str(tmp_path))
    for i in range(12):
        publish(stream, b"a", 1 + i, 1)
        stream.log.sync_blocking()
    path = os.path.join(str(tmp_path), "log", publishers_module.FILE_NAME)
    with open(path, "rb") as file:
        _, _, records, _ = publishers_module.decode_file(path, file.read())
    assert records <= 6
    close(stream)
    assert open_stream(str(tmp_path)).publishers.references() == {b"a": 12}


# -- chunks -------------------------------------------------------------------------------


def deliver(chunk: Chunk) -> schema.Deliver:
    """rstream's own Deliver frame over the chunk: it checks the length, type and CRC."""
    fields = CHUNK_HEADER.unpack_from(chunk.data, 0)
    return schema.Deliver(1, *fields, data=chunk.data[CHUNK_HEADER.size :])


def read_all(stream: StreamQueue, offset: int, flt: ChunkFilter | None = None) -> list[bytes]:
    out: list[bytes] = []
    while (chunk := stream.read_chunk(offset, 7, 1 << 20, flt)) is not None:
        if chunk.records:
            frame = deliver(chunk)
            assert frame.chunk_first_offset == chunk.first_offset >= offset
            out.extend(frame.get_messages())
        offset = chunk.next_offset
    return out


def test_chunk_layout_is_what_rstream_parses(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    stream.append_publish(b"", 1, payload(message(1, b"a"), message(2, b"bc")), 5000)
    assert stream.read_chunk(0, 100, 1 << 20) is None  # not durable yet
    stream.log.sync_blocking()
    chunk = stream.read_chunk(0, 100, 1 << 20)
    assert chunk is not None and (chunk.first_offset, chunk.next_offset, chunk.records) == (0, 2, 2)
    frame = deliver(chunk)
    assert (frame.magic_version, frame.chunk_type, frame.num_entries, frame.num_records) == (
        0x50, 0, 2, 2
    )  # fmt: skip
    assert (frame.timestamp, frame.trailer_length, frame._reserved) == (5000, 0, 0)
    assert len(chunk.data) == 48 + 4 + 1 + 4 + 2
    assert frame.get_messages() == [b"a", b"bc"]
    assert stream.read_chunk(2, 100, 1 << 20) is None
    close(stream)


def test_chunks_respect_limits_offsets_and_segments(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path), segment_bytes_max=4096)
    bodies = [i.to_bytes(2, "big") * (i % 5) for i in range(400)]
    stream.append_publish(b"", 1, payload(*(message(i, b) for i, b in enumerate(bodies))), 1)
    stream.log.sync_blocking()
    assert stream.log.segment_count > 3
    assert read_all(stream, 0) == bodies
    assert read_all(stream, 123) == bodies[123:]
    chunk = stream.read_chunk(10, 1000, 30)
    # Entries of 4 + 0, 4 + 2, 4 + 4 and 4 + 6 bytes: 28; the next (4 + 8) would pass 30.
    assert chunk is not None and (chunk.records, chunk.next_offset) == (4, 14)
    big = stream.read_chunk(14, 1000, 1)  # the first entry always goes in
    assert big is not None and (big.first_offset, big.records) == (14, 1)
    close(stream)


def test_amqp_records_are_converted_to_amqp10(tmp_path: str) -> None:
    stream = open_stream(str(tmp_path))
    props = encode_properties(BasicProperties(content_type="text/plain"))
    stream.append(b"amq.direct", b"rk", props, b"hello", 1000)
    stream.append_publish(b"", 1, payload(message(1, b"native")), 1000)
    stream.log.sync_blocking()
    messages = read_all(stream, 0)
    assert messages == [amqp10.to_amqp10(b"amq.direct", b"rk", props, b"hello"), b"native"]
    close(stream)


def filtered_stream(directory: str) -> StreamQueue:
    stream = open_stream(directory)
    values = [b"eu", b"us", None, b"eu", b"eu", b"us", b"us", None, b"eu"]
    stream.append_publish(
        b"", 2, payload(*(message(i, bytes([i]), v, v2=True) for i, v in enumerate(values))), 1
    )
    headers = BasicProperties(content_type="t", headers={"x-stream-filter-value": "us"})
    stream.append(b"", b"q", encode_properties(headers), b"amqp-us", 1)  # offset 9
    stream.append(b"", b"q", encode_properties(BasicProperties()), b"amqp-none", 1)  # 10
    stream.log.sync_blocking()
    return stream


def test_filter_takes_matching_records_and_ends_chunks_at_gaps(tmp_path: str) -> None:
    stream = filtered_stream(str(tmp_path))
    eu = ChunkFilter(frozenset({b"eu"}), match_unfiltered=False)
    first = stream.read_chunk(0, 100, 1 << 20, eu)
    assert first is not None and (first.first_offset, first.records) == (0, 1)
    # The records passed over after the chunk count in next_offset.
    assert first.next_offset == 3
    second = stream.read_chunk(first.next_offset, 100, 1 << 20, eu)
    assert second is not None and (second.first_offset, second.records) == (3, 2)
    assert deliver(second).get_messages() == [b"\x03", b"\x04"]
    assert [m[-1:] for m in read_all(stream, 0, eu)] == [b"\x00", b"\x03", b"\x04", b"\x08"]
    us = ChunkFilter(frozenset({b"us"}), match_unfiltered=True)
    taken = read_all(stream, 0, us)
    assert taken[:5] == [b"\x01", b"\x02", b"\x05", b"\x06", b"\x07"]
    assert len(taken) == 7  # and the two AMQP records, converted: one "us", one unfiltered
    nothing = stream.read_chunk(9, 100, 1 << 20, ChunkFilter(frozenset({b"eu"}), False))
    assert nothing == Chunk(-1, 11, 0, b"")  # passed over to the end: an empty chunk
    close(stream)


def test_sealed_segments_are_read_through_their_mapping(tmp_path: str) -> None:
    """`view_at` maps sealed segments: chunks from them equal what `read_at` gives, and a
    view still held when retention drops its segment stays readable."""
    stream = open_stream(str(tmp_path), segment_bytes_max=4096)
    for first in range(1, 401, 50):
        publish(stream, b"", first, 50)
        stream.log.sync_blocking()
    log = stream.log
    sealed = [s for s in log.segments() if s.next_offset > s.base_offset][:-1]
    assert len(sealed) >= 3
    head = sealed[0]
    view = log.view_at(head.base_offset, fmt.SEGMENT_HEADER_BYTES, 1 << 20)
    assert isinstance(view, memoryview)
    copied = log.read_at(head.base_offset, fmt.SEGMENT_HEADER_BYTES, 1 << 20)
    assert len(copied) > 1000 and bytes(view) == copied
    assert len(read_all(stream, 0)) == 400
    assert log.drop_segments_before(sealed[1].base_offset) == 1
    assert bytes(view) == copied  # the mapping outlives the drop of its segment
    view.release()
    assert len(read_all(stream, 0)) == 400 - (sealed[1].base_offset - head.base_offset)
    close(stream)
