"""The C record checks of `streamq.log._records`: `check_records` (every chunk a queue
reads back) and `scan_records` (recovery's walk over a segment) against the Python
decoder `format.decode_records` and a plain model of the sparse index."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamq.log import format as fmt
from streamq.log._records import check_records, scan_records

bodies = st.lists(st.binary(max_size=300), min_size=1, max_size=20)


def encode(first: int, payloads: list[bytes], timestamps: list[int] | None = None) -> bytes:
    return b"".join(
        fmt.encode_record(
            first + i,
            timestamps[i] if timestamps else 1000 + i,
            fmt.Message(b"ex", b"rk", b"\x00\x00", body),
        )
        for i, body in enumerate(payloads)
    )


def python_end(data: bytes, first: int) -> int:
    """Where `decode_records` stops: the end of the good records."""
    out: list[fmt.Record] = []
    try:
        result = fmt.decode_records(data, 0, 0, first, 1 << 62, out, 1 << 30, "t")
    except fmt.SegmentCorrupted as exc:
        return exc.position
    return result.position


@settings(max_examples=200, derandomize=True, deadline=None)
@given(payloads=bodies, data=st.data())
def test_check_records_finds_what_the_python_decoder_finds(
    payloads: list[bytes], data: st.DataObject
) -> None:
    whole = bytearray(encode(7, payloads))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(whole) - 1))
        whole[at] ^= 1 << data.draw(st.integers(0, 7))
    cut = data.draw(st.integers(0, len(whole)))
    chunk = bytes(whole[:cut])
    end, next_offset, error = check_records(chunk, 0, 7)
    assert end == python_end(chunk, 7)
    assert next_offset == 7 + sum(1 for _ in _record_starts(chunk[:end]))
    if error is None:
        assert len(chunk) - end < len(chunk) or end == len(chunk) or end == 0
    else:
        assert end < len(chunk)


def _record_starts(data: bytes) -> list[int]:
    starts, position = [], 0
    while position + 4 <= len(data):
        starts.append(position)
        position += 4 + int.from_bytes(data[position : position + 4], "little")
    return starts


def test_check_records_names_what_is_wrong() -> None:
    data = bytearray(encode(0, [b"a", b"b", b"c"]))
    second = _record_starts(bytes(data))[1]
    data[second + 36] ^= 0xFF  # in its body
    end, next_offset, error = check_records(data, 0, 0)
    assert (end, next_offset, error) == (second, 1, "record checksum mismatch")
    assert check_records(encode(5, [b"a"]), 0, 4)[2] == "record offset out of sequence"


@settings(max_examples=150, derandomize=True, deadline=None)
@given(payloads=bodies, interval=st.sampled_from([1, 64, 256, 4096]), data=st.data())
def test_scan_records_builds_the_sparse_index_chunk_by_chunk(
    payloads: list[bytes], interval: int, data: st.DataObject
) -> None:
    timestamps = sorted(
        data.draw(st.lists(st.integers(0, 10**6), min_size=len(payloads), max_size=len(payloads)))
    )
    whole = encode(50, payloads, timestamps)
    starts = _record_starts(whole)
    # The model: an entry for each record starting `interval` or more after the last one.
    model, last = [], -(1 << 62)
    for i, start in enumerate(starts):
        if start + 32 - last >= interval:
            model.append((50 + i, start + 32, timestamps[i]))
            last = start + 32
    # Scan in chunks cut anywhere, as recovery reads a segment, from position 32.
    got: list[tuple[int, int, int]] = []
    position, offset, last_index, last_ts, first_ts = 0, 50, -(1 << 62), -1, -1
    while position < len(whole):
        size = data.draw(st.integers(1, len(whole)))
        chunk = whole[position : position + size]
        end, offset, first, last_ts, entries, stopped = scan_records(
            chunk, 0, offset, 1 << 62, 32 + position, last_index, interval, last_ts
        )
        assert not stopped
        if entries:
            last_index = entries[-1][1]
        got += entries
        if first_ts < 0:
            first_ts = first
        if end == 0:
            chunk = whole[position:]  # a record the chunk could not hold: read it whole
            end, offset, first, last_ts, entries, _ = scan_records(
                chunk, 0, offset, 1 << 62, 32 + position, last_index, interval, last_ts
            )
            if entries:
                last_index = entries[-1][1]
            got += entries
            if first_ts < 0:
                first_ts = first
        position += end
    assert got == model
    assert offset == 50 + len(payloads) and first_ts == timestamps[0]
    assert last_ts == timestamps[-1]


def test_scan_records_stops_for_good_at_damage_disorder_or_the_limit() -> None:
    data = encode(0, [b"a", b"b", b"c"], [5, 9, 7])  # the third goes back in time
    end, offset, _, last_ts, _, stopped = scan_records(data, 0, 0, 1 << 62, 32, 0, 4096, -1)
    assert stopped and offset == 2 and last_ts == 9
    assert end == _record_starts(data)[2]
    end, offset, _, _, _, stopped = scan_records(encode(0, [b"a", b"b"]), 0, 0, 1, 32, 0, 4096, -1)
    assert stopped and offset == 1
    torn = encode(0, [b"a", b"b"])[:-1]
    end, offset, _, _, _, stopped = scan_records(torn, 0, 0, 1 << 62, 32, 0, 4096, -1)
    assert not stopped and offset == 1  # the end of the data, not damage
