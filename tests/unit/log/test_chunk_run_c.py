"""`_streamwire.chunk_run_records` (C, through `chunk_runs.frame_run`) against the Python
path it replaces for AMQP consumers of version-2 streams (`chunk_segment.chunk_records`
then `chunk_runs.chunk_run`): the same records byte for byte for many chunk shapes, None
where the Python path must take over (compressed batches, long filter values), and for
damaged or malformed entries a clean ValueError exactly where the Python reader refuses
them, never a crash or a read past the entries.
"""

from __future__ import annotations

import random
import struct

import pytest

from streamq.log import batches, chunk, frame
from streamq.log._streamwire import chunk_message_spans, chunk_run_records
from streamq.log.chunk import ChunkHeader, ChunkInvalid
from streamq.log.chunk_runs import ChunkRun, chunk_run, frame_run
from streamq.log.chunk_segment import chunk_records
from streamq.log.open_chunk import OpenChunk

HEAD = frame.FRAME_HEAD_BYTES
ENTRIES_AT = HEAD + chunk.HEADER_BYTES  # in `fake_frame`'s frames (no filter)
TIMESTAMP = 1_700_000_000_000
_SIZE = struct.Struct(">I")


def batch_entry(messages: list[bytes], compression: int = chunk.COMPRESSION_NONE) -> bytes:
    body = b"".join(_SIZE.pack(len(m)) + m for m in messages)
    return chunk.encode_entry(chunk.SubBatch(body, len(messages), compression, len(body)))


def random_entries(rng: random.Random, count: int) -> list[tuple[bytes, int, bytes]]:
    """(encoded entry, records, filter value): simple entries (empty ones too) and
    uncompressed batches, values none, short, or at the 255-byte limit."""
    values = [b"", b"", b"red", b"blue", b"v" * 255, bytes(range(7))]
    out = []
    for n in range(count):
        value = rng.choice(values)
        if rng.random() < 0.2:
            messages = [rng.randbytes(rng.randrange(0, 40)) for _ in range(rng.randrange(1, 9))]
            out.append((batch_entry(messages), len(messages), value))
        else:
            body = rng.randbytes(rng.choice((0, 1, 16, rng.randrange(0, 600))))
            out.append((chunk.encode_entry(chunk.SimpleEntry(body + b"%d" % n)), 1, value))
    return out


def stored_frame(items: list[tuple[bytes, int, bytes]], first: int, timestamp_ms: int) -> bytes:
    """A frame as the log stores it (filter, filter values, sequences, entry CRCs)."""
    open_chunk = OpenChunk(first, timestamp_ms)
    for encoded, records, value in items:
        open_chunk.add(encoded, records, value)
    open_chunk.note_sequence(b"publisher-1", 42)
    pieces, _size = open_chunk.encode(epoch=1, bloom_size=16)
    return b"".join(pieces)


def python_run(data: bytes, first: int) -> ChunkRun | None:
    """The Python path: decode the checked frame's records, then render them."""
    header = frame.check_frame(data)
    records: list = []
    chunk_records(data, 0, header, first, header.num_records, records)
    return chunk_run(records, first, header.num_records)


def assert_same(c_run: ChunkRun | None, py_run: ChunkRun | None) -> None:
    assert py_run is not None and c_run is not None
    assert c_run.first_offset == py_run.first_offset
    assert c_run.data == py_run.data
    assert list(c_run.positions) == list(py_run.positions)


@pytest.mark.parametrize("seed", range(60))
def test_stored_chunks_give_the_python_paths_records(seed: int) -> None:
    rng = random.Random(seed)
    items = random_entries(rng, rng.choice((1, 2, rng.randrange(1, 300))))
    first = rng.choice((0, 1_000, 2**40, 2**63 - 100_000))
    timestamp = rng.choice((0, TIMESTAMP, -5, 2**62))
    data = stored_frame(items, first, timestamp)
    records = sum(records for _encoded, records, _value in items)
    assert_same(frame_run(data, first, records), python_run(data, first))
    header = frame.check_frame(data)
    decoded: list = []
    chunk_records(data, 0, header, first, header.num_records, decoded)
    at = HEAD + chunk.HEADER_BYTES + header.bloom_size
    assert spans_outcome(data, at, header) == ("run", [r.body for r in decoded])


def test_a_chunk_without_filter_values_nor_trailer() -> None:
    items = [(chunk.encode_entry(chunk.SimpleEntry(b"m%d" % n)), 1, b"") for n in range(5)]
    raw = chunk.encode_chunk([chunk.SimpleEntry(b"m%d" % n) for n in range(5)], 7, TIMESTAMP)
    data = frame.encode_frame(raw)
    assert chunk.decode_header(data, HEAD).trailer_length == 0
    run = frame_run(data, 7, 5)
    assert_same(run, python_run(data, 7))
    assert run is not None and len(run.positions) == len(items)


def test_a_filter_value_over_255_bytes_or_a_compressed_batch_is_the_python_paths() -> None:
    long_value = [(chunk.encode_entry(chunk.SimpleEntry(b"m")), 1, b"v" * 256)]
    data = stored_frame(long_value, 0, TIMESTAMP)
    assert frame_run(data, 0, 1) is None
    assert python_run(data, 0) is None  # neither path has a run for it
    pytest.importorskip("cramjam")
    zipped = [
        (chunk.encode_entry(chunk.SimpleEntry(b"a")), 1, b""),
        (batch_entry([b"x", b"yy"], chunk.COMPRESSION_NONE), 2, b""),
    ]
    plain = b"".join(_SIZE.pack(len(m)) + m for m in (b"p", b"q"))
    compressed = bytes(batches.codecs()[chunk.COMPRESSION_GZIP].compress(plain))
    zipped.append(
        (chunk.encode_entry(chunk.SubBatch(compressed, 2, chunk.COMPRESSION_GZIP, len(plain))), 2,
         b"")
    )  # fmt: skip
    data = stored_frame(zipped, 10, TIMESTAMP)
    assert frame_run(data, 10, 5) is None
    py_run = python_run(data, 10)
    assert py_run is not None and len(py_run.positions) == 5  # which then has a run


def test_a_damaged_or_misplaced_frame_is_chunk_invalid() -> None:
    items = random_entries(random.Random(1), 20)
    data = stored_frame(items, 100, TIMESTAMP)
    records = sum(records for _encoded, records, _value in items)
    with pytest.raises(ChunkInvalid):
        frame_run(data, 101, records)  # not the chunk indexed
    body = HEAD + chunk.HEADER_BYTES + chunk.decode_header(data, HEAD).bloom_size + 10
    rotted = bytearray(data)
    rotted[body] ^= 0x10
    with pytest.raises(frame.EntriesDamaged):
        frame_run(bytes(rotted), 100, records)
    with pytest.raises(ChunkInvalid):
        frame_run(data[:-1], 100, records)


# Malformed entries, past the checksums (as if written so): the C walk against the
# Python reader, over entries given straight to both.


def fake_frame(entries: bytes, num_entries: int, num_records: int, trailer: bytes) -> bytes:
    """8 bytes of frame head, a chunk header saying what it is told, the entries and the
    trailer: nothing checked (the readers below do not check CRCs)."""
    header = chunk.HEADER.pack(chunk.MAGIC_VERSION, 0, num_entries & 0xFFFF, num_records,
                               TIMESTAMP, 1, 500, 0, len(entries), len(trailer), 0)  # fmt: skip
    return bytes(HEAD) + header + entries + trailer


def python_outcome(entries: bytes, num_entries: int, num_records: int,
                   runs: list[frame.FilterRun]) -> tuple[str, ChunkRun | None]:  # fmt: skip
    trailer = frame.encode_trailer({}, runs)
    data = fake_frame(entries, num_entries, num_records, trailer)
    header = ChunkHeader(0, num_entries, num_records, TIMESTAMP, 1, 500, 0, len(entries),
                         len(trailer), 0)  # fmt: skip
    if any(len(value) > 255 for value in frame.filter_value_list(runs, num_entries)):
        return "none", None  # the C function looks at the values first
    records: list = []
    try:
        for entry in chunk.iter_entries(data, HEAD, header):
            if entry.batch and entry.compression:
                return "none", None  # ... then stops at the first compressed batch
            if entry.batch:
                batches.messages(entry)
        chunk_records(data, 0, header, 500, num_records, records)
    except ChunkInvalid:
        return "invalid", None
    run = chunk_run(records, 500, num_records)
    return ("none", None) if run is None else ("run", run)


def c_outcome(entries: bytes, num_entries: int, num_records: int,
              runs: list[frame.FilterRun]) -> tuple[str, ChunkRun | None]:  # fmt: skip
    data = fake_frame(entries, num_entries, num_records, b"")
    try:
        made = chunk_run_records(data, ENTRIES_AT, len(entries), num_entries, 500, num_records,
                                 TIMESTAMP, runs)  # fmt: skip
    except ValueError:
        return "invalid", None
    if made is None:
        return "none", None
    positions = struct.unpack(f"={len(made[1]) // 8}q", made[1])
    return "run", ChunkRun(500, made[0], positions)  # type: ignore[arg-type]


def spans_outcome(data: bytes, entries_at: int, header: ChunkHeader
                  ) -> tuple[str, list[bytes] | None]:  # fmt: skip
    """`chunk_message_spans` of a chunk, as the messages its spans cut from `data`."""
    try:
        spans = chunk_message_spans(data, entries_at, header.data_length, header.num_entries,
                                    header.first_offset, header.num_records)  # fmt: skip
    except ValueError:
        return "invalid", None
    if spans is None:
        return "none", None
    pairs = struct.unpack(f"={len(spans) // 8}q", spans)
    return "run", [data[pairs[i] : pairs[i + 1]] for i in range(0, len(pairs), 2)]


def assert_outcomes_agree(entries: bytes, num_entries: int, num_records: int,
                          runs: list[frame.FilterRun] | None = None) -> str:  # fmt: skip
    runs = runs or []
    py_kind, py_run = python_outcome(entries, num_entries, num_records, runs)
    c_kind, c_run = c_outcome(entries, num_entries, num_records, runs)
    assert c_kind == py_kind, (entries.hex(), num_entries, num_records)
    if py_kind == "run":
        assert_same(c_run, py_run)
    if not runs:  # the spans walk the same entries (filter values play no part)
        header = ChunkHeader(500, num_entries, num_records, TIMESTAMP, 1, 500, 0, len(entries),
                             0, 0)  # fmt: skip
        data = fake_frame(entries, num_entries, num_records, b"")
        spans_kind, messages = spans_outcome(data, ENTRIES_AT, header)
        assert spans_kind == py_kind, (entries.hex(), num_entries, num_records)
        if py_run is not None:
            records: list = []
            chunk_records(data, 0, header, 500, num_records, records)
            assert messages == [r.body for r in records]
    return c_kind


def sample_entries() -> tuple[bytes, int, int]:
    items = [
        chunk.encode_entry(chunk.SimpleEntry(b"first")),
        batch_entry([b"a", b"", b"ccc"]),
        chunk.encode_entry(chunk.SimpleEntry(b"")),
        batch_entry([b"only"]),
        chunk.encode_entry(chunk.SimpleEntry(b"last one")),
    ]
    return b"".join(items), 5, 7


def test_every_truncation_of_the_entries_is_refused() -> None:
    entries, count, records = sample_entries()
    assert assert_outcomes_agree(entries, count, records) == "run"
    for cut in range(len(entries)):
        assert assert_outcomes_agree(entries[:cut], count, records) == "invalid"


def test_counts_other_than_the_entries_are_refused() -> None:
    entries, count, records = sample_entries()
    for wrong_count, wrong_records in ((count - 1, records), (count + 1, records),
                                       (count, records - 1), (count, records + 1)):  # fmt: skip
        assert assert_outcomes_agree(entries, wrong_count, wrong_records) == "invalid"


@pytest.mark.parametrize("seed", range(40))
def test_flipped_bytes_in_the_entries_agree_with_the_python_reader(seed: int) -> None:
    rng = random.Random(seed)
    entries, count, records = sample_entries()
    outcomes = set()
    for _ in range(60):
        damaged = bytearray(entries)
        for _flip in range(rng.randrange(1, 4)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        outcomes.add(assert_outcomes_agree(bytes(damaged), count, records))
    assert "invalid" in outcomes


def test_batch_header_fields_one_by_one() -> None:
    def batch(kind: int, records: int, messages: bytes) -> bytes:
        return struct.pack(">BHII", kind, records, len(messages), len(messages)) + messages

    two = _SIZE.pack(1) + b"x" + _SIZE.pack(2) + b"yy"
    assert assert_outcomes_agree(batch(0x80, 2, two), 1, 2) == "run"
    assert assert_outcomes_agree(batch(0x81, 2, two), 1, 2) == "invalid"  # reserved bits
    assert assert_outcomes_agree(batch(0xD0, 2, two), 1, 2) == "invalid"  # compression 5
    assert assert_outcomes_agree(batch(0x80, 0, b""), 1, 0) == "invalid"  # no records
    assert assert_outcomes_agree(batch(0x80, 1, two), 1, 1) == "invalid"  # more messages
    assert assert_outcomes_agree(batch(0x80, 3, two), 1, 3) == "invalid"  # fewer
    assert assert_outcomes_agree(batch(0x80, 2, two + b"\0"), 1, 2) == "invalid"  # slack
    # A message size that runs past the batch, though not past the entries.
    past = batch(0x80, 1, _SIZE.pack(9) + b"abc") + chunk.encode_entry(chunk.SimpleEntry(b"z"))
    assert assert_outcomes_agree(past, 2, 2) == "invalid"
    huge = batch(0x80, 1, _SIZE.pack(0xFFFFFFFF) + b"abc")
    assert assert_outcomes_agree(huge, 1, 1) == "invalid"
    # An entry size of 2^31 - 1, and a batch length of 2^32 - 1: past the end, refused.
    assert assert_outcomes_agree(b"\x7f\xff\xff\xff" + b"abc", 1, 1) == "invalid"
    assert assert_outcomes_agree(struct.pack(">BHII", 0x80, 1, 0, 0xFFFFFFFF), 1, 1) == "invalid"


def test_filter_runs_later_wins_and_past_the_entries_is_ignored() -> None:
    entries, count, records = sample_entries()
    shapes: list[list[frame.FilterRun]] = [
        [(0, 5, b"all")],
        [(1, 2, b"mid"), (2, 3, b"later")],
        [(4, 100, b"clipped"), (9, 3, b"past"), (60_000, 5, b"far")],
        [(0, 0, b"empty run"), (3, 1, b"v" * 255)],
        [(2, 1, b"v" * 256), (2, 1, b"short again")],  # overridden: fits
    ]
    for runs in shapes:
        assert assert_outcomes_agree(entries, count, records, runs) == "run"
    assert assert_outcomes_agree(entries, count, records, [(2, 1, b"v" * 256)]) == "none"


def test_bad_arguments_are_refused_not_read_past() -> None:
    entries, count, records = sample_entries()
    data = fake_frame(entries, count, records, b"")
    args = (count, 500, records, TIMESTAMP, [])
    with pytest.raises(ValueError):
        chunk_run_records(data, ENTRIES_AT, len(entries) + 1, *args)
    with pytest.raises(ValueError):
        chunk_run_records(data, len(data) + 1, 0, *args)
    with pytest.raises(ValueError):
        chunk_run_records(data, -1, len(entries), *args)
    with pytest.raises(ValueError):
        chunk_run_records(data, ENTRIES_AT, len(entries), 0, 500, records, TIMESTAMP, [])
    with pytest.raises(ValueError):
        chunk_run_records(data, ENTRIES_AT, len(entries), count, 2**64 - 3, records,
                          TIMESTAMP, [])  # fmt: skip
    with pytest.raises(ValueError):
        chunk_run_records(data, ENTRIES_AT, len(entries), count, 500, records, TIMESTAMP,
                          [(-1, 2, b"x")])  # fmt: skip
    with pytest.raises(TypeError):
        chunk_run_records(data, ENTRIES_AT, len(entries), count, 500, records, TIMESTAMP,
                          [(0, 2, "str")])  # type: ignore[list-item]  # fmt: skip
    made = chunk_run_records(memoryview(data), ENTRIES_AT, len(entries), *args)
    assert made is not None and len(made[1]) == 8 * records


def test_the_spans_refuse_what_the_records_refuse() -> None:
    entries, count, records = sample_entries()
    data = fake_frame(entries, count, records, b"")
    for bad in ((ENTRIES_AT, len(entries) + 1, count, 500, records),
                (len(data) + 1, 0, count, 500, records), (-1, len(entries), count, 500, records),
                (ENTRIES_AT, len(entries), 0, 500, records),
                (ENTRIES_AT, len(entries), count, 2**64 - 3, records),
                (ENTRIES_AT, len(entries), count, 500, len(entries))):  # fmt: skip
        with pytest.raises(ValueError):
            chunk_message_spans(data, *bad)
    with pytest.raises(TypeError):
        chunk_message_spans(data, ENTRIES_AT, len(entries), count, 500)  # type: ignore[call-arg]
    spans = chunk_message_spans(memoryview(data), ENTRIES_AT, len(entries), count, 500, records)
    assert spans is not None and len(spans) == 16 * records
