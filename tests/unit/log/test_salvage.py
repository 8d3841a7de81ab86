"""Per-entry checksums of a stored chunk (the trailer's 0x81 record) and `salvage`: a
flipped bit in an entry loses that entry alone, whether it hit the body, the size field
or a sub-entry batch's header; a flip in the header or trailer fails the whole frame;
what is kept is byte for byte what was written, under its own offset, never another's.
"""

from __future__ import annotations

import random
import struct

import pytest

from streamq.log import chunk, frame
from streamq.log._records import crc32c, entry_crcs
from streamq.log.chunk import ChunkInvalid
from streamq.log.open_chunk import OpenChunk
from streamq.log.salvage import salvage

FIRST = 1_000
HEAD = frame.FRAME_HEAD_BYTES


def entries() -> list[tuple[bytes, int]]:
    """(encoded entry, records): simple entries of several sizes and a batch of 3."""
    out = [
        (chunk.encode_entry(chunk.SimpleEntry(b"m%03d" % n * (1 + n % 4))), 1) for n in range(12)
    ]
    batch = b"".join(struct.pack(">I", 5) + b"b%04d" % n for n in range(3))
    out.insert(5, (chunk.encode_entry(chunk.SubBatch(batch, 3, 0, len(batch))), 3))
    return out


def stored(items: list[tuple[bytes, int]]) -> bytes:
    open_chunk = OpenChunk(FIRST, 1_700_000_000_000)
    for n, (encoded, records) in enumerate(items):
        open_chunk.add(encoded, records, b"red" if n % 3 == 0 else b"")
    pieces, _size = open_chunk.encode(epoch=1, bloom_size=16)
    return b"".join(pieces)


def offsets_of(items: list[tuple[bytes, int]]) -> list[int]:
    out, offset = [], FIRST
    for _encoded, records in items:
        out.append(offset)
        offset += records
    return out


def entries_start(data: bytes) -> int:
    header = chunk.decode_header(data, HEAD)
    return HEAD + chunk.HEADER_BYTES + header.bloom_size


def flipped(data: bytes, byte: int, bit: int = 3) -> bytes:
    out = bytearray(data)
    out[byte] ^= 1 << bit
    return bytes(out)


def check_kept(data: bytes, items: list[tuple[bytes, int]]) -> set[int]:
    """Salvage `data`; assert every kept entry is the one written at its offset; the
    entry numbers lost."""
    header = chunk.decode_header(data, HEAD)
    found = salvage(data, HEAD, header)
    offsets = offsets_of(items)
    for number, view in found.entries:
        encoded, records = items[number]
        assert view.offset == offsets[number] and view.records == records
        assert bytes(view.data) == encoded[11:] if view.batch else encoded[4:]
    kept = {number for number, _ in found.entries}
    lost_offsets = {o for span in found.lost for o in range(span.first_offset, span.end_offset)}
    for number in set(range(len(items))) - kept:
        assert set(range(offsets[number], offsets[number] + items[number][1])) <= lost_offsets
    return set(range(len(items))) - kept


def test_the_trailer_holds_each_entrys_crc32c() -> None:
    items = entries()
    data = stored(items)
    header = frame.check_frame(data)
    trailer = frame.parse_trailer(chunk.trailer_of(data, HEAD, header))
    expected = b"".join(struct.pack(">I", crc32c(encoded)) for encoded, _ in items)
    assert trailer.entry_crcs == expected == entry_crcs(b"".join(e for e, _ in items))


def test_a_flip_anywhere_in_an_entry_loses_that_entry_alone() -> None:
    items = entries()
    data = stored(items)
    at = entries_start(data)
    for number, (encoded, _records) in enumerate(items):
        for byte in range(at, at + len(encoded)):
            damaged = flipped(data, byte, bit=byte % 8)
            with pytest.raises(frame.EntriesDamaged):
                frame.check_frame(damaged)
            assert check_kept(damaged, items) == {number}, (number, byte - at)
        at += len(encoded)


def test_a_flip_in_the_header_or_trailer_is_not_salvaged() -> None:
    data = stored(entries())
    header = chunk.decode_header(data, HEAD)
    trailer_at = HEAD + header.size - header.trailer_length
    for byte in (HEAD + 20, trailer_at + 2, len(data) - 1):
        with pytest.raises(ChunkInvalid) as caught:
            frame.check_frame(flipped(data, byte))
        assert not isinstance(caught.value, frame.EntriesDamaged)


def test_a_chunk_without_entry_checksums_cannot_be_salvaged() -> None:
    body = chunk.encode_entry(chunk.SimpleEntry(b"x" * 10))
    built = chunk.encode_chunk([chunk.SimpleEntry(b"x" * 10)], FIRST, 0, 1)
    data = frame.encode_frame(built)
    damaged = flipped(data, len(data) - 3)  # in the only entry's body (no trailer)
    assert chunk.decode_header(data, HEAD).trailer_length == 0 and body in data
    with pytest.raises(frame.EntriesDamaged):
        frame.check_frame(damaged)
    with pytest.raises(ChunkInvalid):
        salvage(damaged, HEAD, chunk.decode_header(damaged, HEAD))


def test_random_flips_in_the_entries_never_give_a_wrong_entry() -> None:
    rng = random.Random(32)
    items = entries()
    data = stored(items)
    start = entries_start(data)
    end = start + chunk.decode_header(data, HEAD).data_length
    for _ in range(2000):
        damaged = data
        for _flip in range(rng.randint(1, 3)):
            damaged = flipped(damaged, rng.randrange(start, end), rng.randrange(8))
        hits, at = set(), start  # the entries whose bytes changed (a bit flipped twice did not)
        for number, (encoded, _records) in enumerate(items):
            if damaged[at : at + len(encoded)] != encoded:
                hits.add(number)
            at += len(encoded)
        if not hits:
            continue
        lost = check_kept(damaged, items)
        assert hits <= lost
