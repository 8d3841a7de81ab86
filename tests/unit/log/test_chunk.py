"""The osiris chunk codec (streamq/log/chunk.py): round trips, every refusal, the bloom
filter against Erlang's own phash2 and osiris_bloom's bit layout (run in `erl`), and
rstream's Deliver parser over our chunks."""

from __future__ import annotations

import gzip
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rstream import schema
from rstream.encoding import decode_frame

from streamq.log import bloom
from streamq.log import chunk as ck

ERL_TIMEOUT_S = 60.0

filter_values = st.one_of(st.just(b""), st.binary(min_size=1, max_size=40))
simple_entries = st.builds(ck.SimpleEntry, st.binary(max_size=300), filter_values)
batches = st.builds(
    ck.SubBatch,
    st.binary(max_size=300),
    st.integers(1, ck.BATCH_RECORDS_MAX),
    st.integers(0, ck.COMPRESSION_MAX),
    st.integers(0, ck.U32_MAX),
    filter_values,
)
tracking = st.builds(
    ck.TrackingRecord,
    st.sampled_from([ck.TRACKING_SEQUENCE, ck.TRACKING_OFFSET]),
    st.binary(max_size=ck.TRACKING_ID_BYTES_MAX),
    st.integers(0, ck.U64_MAX),
    chunk_id=st.just(-1),
)


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(st.one_of(simple_entries, batches), min_size=1, max_size=20),
    first=st.integers(0, 2**62),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    epoch=st.integers(0, ck.U64_MAX),
    trailer=st.lists(tracking, max_size=4),
    bloom_size=st.integers(bloom.BLOOM_SIZE_MIN, bloom.BLOOM_SIZE_MAX),
)
def test_round_trip(
    entries: list[ck.Entry],
    first: int,
    timestamp: int,
    epoch: int,
    trailer: list[ck.TrackingRecord],
    bloom_size: int,
) -> None:
    trailer_bytes = ck.encode_tracking(trailer)
    data = ck.encode_chunk(entries, first, timestamp, epoch, trailer_bytes, bloom_size)
    header = ck.check_chunk(b"junk" + data, 4)
    records = sum(e.records if isinstance(e, ck.SubBatch) else 1 for e in entries)
    assert header.size == len(data)
    assert (header.first_offset, header.timestamp_ms, header.epoch) == (first, timestamp, epoch)
    assert (header.num_entries, header.num_records, header.next_offset) == (
        len(entries),
        records,
        first + records,
    )
    has_values = any(e.filter_value for e in entries)
    assert header.bloom_size == (bloom_size if has_values else 0)
    views = list(ck.iter_entries(data))
    assert [bytes(v.data) for v in views] == [e.data for e in entries]
    offset = first
    for view, entry in zip(views, entries, strict=True):
        assert view.offset == offset
        assert view.batch == isinstance(entry, ck.SubBatch)
        if isinstance(entry, ck.SubBatch):
            assert (view.records, view.compression, view.uncompressed_length) == (
                entry.records,
                entry.compression,
                entry.uncompressed_length,
            )
        offset += view.records
    assert ck.parse_tracking(ck.trailer_of(data, 0, header)) == trailer
    bits = ck.bloom_of(data, 0, header)
    for entry in entries:  # no false negatives
        assert bloom.bloom_may_match(bits, [entry.filter_value], not entry.filter_value)
    # What a Deliver carries: the header unchanged, then the entries.
    (hpos, hlen), (dpos, dlen) = ck.deliver_spans(header)
    assert zlib.crc32(data[dpos : dpos + dlen]) == header.crc
    assert data[hpos : hpos + hlen] == data[: ck.HEADER_BYTES]


@given(st.lists(tracking, max_size=5), st.lists(st.integers(0, ck.U64_MAX), min_size=5, max_size=5))
def test_tracking_snapshot_round_trip(
    records: list[ck.TrackingRecord], chunk_ids: list[int]
) -> None:
    records = [
        r._replace(chunk_id=c if r.kind == ck.TRACKING_SEQUENCE else -1)
        for r, c in zip(records, chunk_ids, strict=False)
    ]
    stamped = [*records, ck.TrackingRecord(ck.TRACKING_TIMESTAMP, b"c", -5)]
    assert ck.parse_tracking(ck.encode_tracking(stamped, snapshot=True), snapshot=True) == stamped


def _chunk(entries: list[ck.Entry] | None = None, trailer: bytes = b"") -> bytearray:
    entries = entries or [ck.SimpleEntry(b"hello", b"v")]
    return bytearray(ck.encode_chunk(entries, 7, 1000, trailer=trailer))


def _refit(data: bytearray, **fields: int) -> bytearray:
    """`data` with header fields replaced, and its CRC recomputed over the entries."""
    header = ck.decode_header(data)._replace(**fields)
    values = list(header)
    ck.HEADER.pack_into(data, 0, ck.MAGIC_VERSION, *values)
    start = ck.HEADER_BYTES + header.bloom_size
    crc = zlib.crc32(bytes(data[start : start + header.data_length]))
    struct.pack_into(">I", data, 32, crc)
    return data


def test_refuses_short_and_bad_headers() -> None:
    data = _chunk()
    with pytest.raises(ck.ChunkTruncated):
        ck.decode_header(data[:47])
    for magic in (0x51, 0x40, 0x00):
        bad = bytearray(data)
        bad[0] = magic
        with pytest.raises(ck.ChunkInvalid, match="magic"):
            ck.decode_header(bad)
    bad = bytearray(data)
    bad[1] = 3
    with pytest.raises(ck.ChunkInvalid, match="chunk type"):
        ck.decode_header(bad)
    for size in (1, 15):
        bad = bytearray(data)
        bad[44] = size
        with pytest.raises(ck.ChunkInvalid, match="bloom"):
            ck.decode_header(bad)
    with pytest.raises(ck.ChunkInvalid, match="entries"):
        ck.decode_header(_refit(bytearray(data), num_entries=0))
    batch = _chunk([ck.SubBatch(b"x", 3)])
    with pytest.raises(ck.ChunkInvalid, match="records"):
        ck.decode_header(_refit(batch, num_entries=2, num_records=1))
    with pytest.raises(ck.ChunkInvalid, match="u64"):
        ck.decode_header(_refit(bytearray(data), first_offset=ck.U64_MAX))


def test_refuses_truncated_and_damaged_chunks() -> None:
    data = _chunk(trailer=ck.encode_tracking([ck.TrackingRecord(ck.TRACKING_OFFSET, b"c", 1)]))
    for cut in (48, 48 + 16, len(data) - 1):  # in the filter, the entries, the trailer
        with pytest.raises(ck.ChunkTruncated):
            ck.check_chunk(data[:cut])
    bad = bytearray(data)
    bad[-20] ^= 1  # in the entries
    with pytest.raises(ck.ChunkInvalid, match="CRC32"):
        ck.check_chunk(bad)
    rotted = bytearray(data)
    rotted[33] ^= 0x10  # bit rot in the header's CRC field
    with pytest.raises(ck.ChunkInvalid, match="CRC32"):
        ck.check_chunk(rotted)


def test_refuses_bad_entry_framing() -> None:
    two = _chunk([ck.SimpleEntry(b"ab"), ck.SimpleEntry(b"cd")])
    with pytest.raises(ck.ChunkInvalid, match="entries and"):
        ck.check_chunk(_refit(bytearray(two), num_entries=3, num_records=3))
    with pytest.raises(ck.ChunkInvalid, match="more entries"):
        ck.check_chunk(_refit(bytearray(two), num_entries=1, num_records=1))
    simple = _chunk([ck.SimpleEntry(b"abcdef")])
    struct.pack_into(">I", simple, ck.HEADER_BYTES, 7)  # size past the end
    with pytest.raises(ck.ChunkInvalid, match="crosses"):
        ck.check_chunk(_refit(simple))
    short = _chunk([ck.SimpleEntry(b"ab")])
    with pytest.raises(ck.ChunkInvalid, match="crosses"):  # 6 bytes of entries; claim 2
        ck.check_chunk(_refit(short, data_length=2))
    batch = _chunk([ck.SubBatch(b"abc", 2)])
    for kind, reason in ((0x81, "reserved"), (0xD0, "compression"), (0xF0, "compression")):
        bad = bytearray(batch)
        bad[ck.HEADER_BYTES] = kind
        with pytest.raises(ck.ChunkInvalid, match=reason):
            ck.check_chunk(_refit(bad))
    zero = bytearray(batch)
    struct.pack_into(">H", zero, ck.HEADER_BYTES + 1, 0)
    with pytest.raises(ck.ChunkInvalid, match="0 records"):
        ck.check_chunk(_refit(zero, num_records=1))
    long = bytearray(batch)
    struct.pack_into(">I", long, ck.HEADER_BYTES + 7, 4)
    with pytest.raises(ck.ChunkInvalid, match="crosses"):
        ck.check_chunk(_refit(long))
    with pytest.raises(ck.ChunkInvalid, match="crosses"):  # a batch header cut short
        ck.check_chunk(_refit(bytearray(batch), data_length=8))
    with pytest.raises(ck.ChunkInvalid, match="crosses"):  # an entry header cut short
        ck.check_chunk(_refit(bytearray(two), data_length=9))


def test_encoder_refusals() -> None:
    one = [ck.SimpleEntry(b"a")]
    for size in (0, 15, 256):
        with pytest.raises(ValueError, match="bloom"):
            ck.encode_chunk(one, 0, 0, bloom_size=size)
    with pytest.raises(ValueError, match="chunk type"):
        ck.encode_chunk(one, 0, 0, chunk_type=3)
    with pytest.raises(ValueError, match="entries"):
        ck.encode_chunk([], 0, 0)
    with pytest.raises(ValueError, match="entries"):
        ck.encode_chunk([ck.SimpleEntry(b"")] * (ck.ENTRIES_MAX + 1), 0, 0)
    with pytest.raises(ValueError, match="u64"):
        ck.encode_chunk(one, ck.U64_MAX, 0)
    with pytest.raises(ValueError, match="u64"):
        ck.encode_chunk(one, 0, 0, epoch=-1)
    for compression in (-1, 5):
        with pytest.raises(ValueError, match="compression"):
            ck.encode_entry(ck.SubBatch(b"", 1, compression))
    for records in (0, ck.BATCH_RECORDS_MAX + 1):
        with pytest.raises(ValueError, match="records"):
            ck.encode_entry(ck.SubBatch(b"", records))
    with pytest.raises(ValueError, match="u32"):
        ck.encode_entry(ck.SubBatch(b"", 1, 0, ck.U32_MAX + 1))
    with pytest.raises(ValueError, match="tracking id"):
        ck.encode_tracking([ck.TrackingRecord(0, b"x" * 256, 1)])
    with pytest.raises(ValueError, match="tracking type"):
        ck.encode_tracking([ck.TrackingRecord(3, b"x", 1)])


def test_trailer_refusals() -> None:
    good = ck.encode_tracking([ck.TrackingRecord(ck.TRACKING_SEQUENCE, b"pub", 9)])
    with pytest.raises(ck.ChunkInvalid, match="crosses"):
        ck.parse_tracking(good[:-1])
    with pytest.raises(ck.ChunkInvalid, match="crosses"):
        ck.parse_tracking(good[:1])
    with pytest.raises(ck.ChunkInvalid, match="crosses"):  # a snapshot's sequence is longer
        ck.parse_tracking(good, snapshot=True)
    with pytest.raises(ck.ChunkInvalid, match="tracking type"):
        ck.parse_tracking(b"\x07" + good[1:])


def test_bloom_without_values_and_unfiltered_bit() -> None:
    assert bloom.bloom_filter([b"", b""]) == b""
    assert bloom.bloom_filter([]) == b""
    bits = bloom.bloom_filter([b"", b"x"])
    assert bits[0] & 0x80  # bit 0: an entry without a value
    assert not bloom.bloom_filter([b"x"])[0] & 0x80
    assert bloom.bloom_may_match(b"", [b"x"], True)
    assert not bloom.bloom_may_match(b"", [b"x"], False)
    assert bloom.bloom_may_match(bits, [b"nope"], True)
    assert not bloom.bloom_may_match(bloom.bloom_filter([b"x"]), [], True)


# Erlang's own phash2, and the filter laid out as osiris_bloom reads it: bit N of the
# filter is `<<_:N, 1:1, _/bitstring>>`, i.e. counted from the most significant bit.
_ERLANG_BLOOM = r"""
-module(sqbloom).
-export([main/1]).
bits(<<>>, _) -> [0];
bits(V, Bits) -> [erlang:phash2(V, Bits - 1) + 1, erlang:phash2([V], Bits - 1) + 1].
filter(Size, Values) ->
    Bits = Size * 8,
    Set = lists:usort(lists:append([bits(V, Bits) || V <- Values])),
    Int = lists:foldl(fun(N, Acc) -> Acc bor (1 bsl (Bits - 1 - N)) end, 0, Set),
    <<Int:Bits>>.
main([File]) ->
    {ok, Cases} = file:consult(File),
    [io:format("~s~n", [binary:encode_hex(filter(S, Vs))]) || {S, Vs} <- Cases],
    [io:format("~b ~b~n", [erlang:phash2(V, 4294967296), erlang:phash2([V], 4294967296)])
     || {_, Vs} <- Cases, V <- Vs].
"""


def _erlang_binary(value: bytes) -> str:
    return "<<" + ",".join(str(b) for b in value) + ">>"


def test_bloom_matches_erlang(tmp_path: Path) -> None:
    erlc, erl = shutil.which("erlc"), shutil.which("erl")
    assert erlc and erl, "Erlang (installed with rabbitmq-server) is needed"
    rng = __import__("random").Random(32)
    cases: list[tuple[int, list[bytes]]] = [(16, [b"apple"]), (16, [b"", b"a", b"abc"])]
    for _ in range(60):
        size = rng.choice([16, 17, 64, 255, rng.randint(16, 255)])
        values = [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(1, 8))]
        cases.append((size, values))
    (tmp_path / "sqbloom.erl").write_text(_ERLANG_BLOOM)
    terms = "".join(f"{{{s}, [{','.join(map(_erlang_binary, vs))}]}}.\n" for s, vs in cases)
    (tmp_path / "cases.txt").write_text(terms)
    subprocess.run([erlc, "sqbloom.erl"], cwd=tmp_path, check=True, timeout=ERL_TIMEOUT_S)
    out = subprocess.run(
        [erl, "-noshell", "-run", "sqbloom", "main", "cases.txt", "-s", "init", "stop"],
        cwd=tmp_path, check=True, timeout=ERL_TIMEOUT_S, capture_output=True, text=True,
    ).stdout.split("\n")  # fmt: skip
    for i, (size, values) in enumerate(cases):
        if any(values):
            assert bloom.bloom_filter(values, size) == bytes.fromhex(out[i]), (size, values)
        else:  # osiris' to_binary leaves the filter out when no entry has a value
            assert bloom.bloom_filter(values, size) == b""
    hashes = [line.split() for line in out[len(cases) :] if line]
    flat = [v for _, vs in cases for v in vs]
    for value, (h1, h2) in zip(flat, hashes, strict=True):
        assert (bloom.phash2_binary(value), bloom.phash2_list_of_binary(value)) == (
            int(h1),
            int(h2),
        )


def _deliver_frame(data: bytes) -> schema.Deliver:
    """The Deliver (v1) a stream-protocol reader sends for the stored chunk `data`."""
    header = ck.decode_header(data)
    (hpos, hlen), (dpos, dlen) = ck.deliver_spans(header)
    frame = struct.pack(">HHB", 0x0008, 1, 5) + data[hpos : hpos + hlen] + data[dpos : dpos + dlen]
    decoded = decode_frame(frame)
    assert isinstance(decoded, schema.Deliver)
    return decoded


def _batch_body(messages: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(m)) + m for m in messages)


def test_rstream_decodes_our_chunks() -> None:
    inner = [b"one", b"two" * 50, b""]
    plain, zipped = _batch_body(inner), gzip.compress(_batch_body(inner))
    entries: list[ck.Entry] = [
        ck.SimpleEntry(b"first", b"red"),
        ck.SubBatch(plain, len(inner), ck.COMPRESSION_NONE, len(plain)),
        ck.SubBatch(zipped, len(inner), ck.COMPRESSION_GZIP, len(plain), b"blue"),
        ck.SimpleEntry(b"last"),
    ]
    trailer = ck.encode_tracking([ck.TrackingRecord(ck.TRACKING_SEQUENCE, b"pub-1", 41)])
    data = ck.encode_chunk(entries, 100, 1_700_000_000_000, 3, trailer)
    frame = _deliver_frame(data)
    assert (frame.chunk_first_offset, frame.epoch, frame.num_entries, frame.num_records) == (
        100,
        3,
        4,
        2 + 2 * len(inner),
    )
    assert frame.get_messages() == [b"first", *inner, *inner, b"last"]
