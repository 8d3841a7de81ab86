"""Bulk decode of a run of records into columns: the executor's fast path.

Owns `decode_columns`, the column-wise twin of `streamq.log.format.decode_records`: the
same arguments, the same stopping rules, the same checks (length, CRC32C, dense offsets,
flags) and the same `SegmentCorrupted` errors, but numpy arrays instead of one `Record`
tuple per record. The only per-record Python is the walk along the length fields (each
record's position depends on the previous one's length); the fixed header fields are
gathered for all records at once, the checks run on whole arrays, and the CRCs of all
records are verified in one CRC32C pass (`fmt.crc32c_chain`).

Rules:
1. When any check fails, the chunk is decoded again with `fmt.decode_records`, which
   raises the error the per-record reader raises: one source of truth for damage.
2. Pure functions over buffers; no I/O (`logdir` reads the bytes).
"""

from __future__ import annotations

import struct
from array import array
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from streamq.log import format as fmt
from streamq.log._records import crc32c
from streamq.log.errors import SegmentCorrupted

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]

_LENGTH: Final = struct.Struct("<I")
# A run of equal-size records shorter than this is not worth its numpy calls (~10 us).
RUN_RECORDS_MIN: Final = 64
# The record header as laid out in streamq/log/format.py (RECORD_HEADER), packed.
_HEADER_FIELDS: Final = (
    ("length", "<u4"),
    ("crc", "<u4"),
    ("offset", "<u8"),
    ("timestamp_ms", "<i8"),
    ("exchange_len", "u1"),
    ("routing_key_len", "u1"),
    ("flags", "<u2"),
    ("properties_len", "<u4"),
)
_HEADER: Final = np.dtype(list(_HEADER_FIELDS))
assert _HEADER.itemsize == fmt.RECORD_HEADER_BYTES


class RecordColumns(NamedTuple):
    """Records of one chunk as arrays. Record i spans `buffer[positions[i]:ends[i]]`;
    its exchange, routing key, properties and body follow each other from
    `positions[i] + RECORD_HEADER_BYTES`, with the lengths given."""

    buffer: bytes
    positions: Ints
    ends: Ints
    offsets: Ints
    timestamps_ms: Ints
    exchange_lens: Ints
    routing_key_lens: Ints
    properties_lens: Ints

    @property
    def record_count(self) -> int:
        return len(self.offsets)


def decode_columns(
    buffer: bytes,
    buffer_position: int,
    start: int,
    expected_offset: int,
    offset_end: int,
    records_max: int,
    path: str,
    skip_before: int = 0,
) -> tuple[RecordColumns, fmt.DecodeResult]:
    """`fmt.decode_records` (same arguments but the output list), as columns.

    Raises SegmentCorrupted for a bad length, CRC, flags or an offset out of sequence,
    exactly as `decode_records` does (it is the one that raises, see rule 1).
    """
    skipped = max(0, min(skip_before, offset_end) - expected_offset)
    walk_max = max(0, min(offset_end - expected_offset, skipped + records_max))
    data = np.frombuffer(buffer, np.uint8)
    at, stop, complete = _walk(buffer, data, start, walk_max)
    count = len(at)
    fields = _gather_fields(data, at)
    if not _intact(data, at, stop, fields, expected_offset):
        fmt.decode_records(
            buffer, buffer_position, start, expected_offset, offset_end, [], walk_max, path
        )
        raise SegmentCorrupted(path, buffer_position + start, "chained CRC32C check failed")
    if not complete and stop + fmt.RECORD_HEADER_BYTES <= len(buffer):
        # The next record runs past the buffer: a bad length there is damage, else the
        # caller reads more. decode_records decides which, for that one record.
        fmt.decode_records(
            buffer, buffer_position, stop, expected_offset + count, offset_end, [], 1, path
        )
    result = fmt.DecodeResult(stop, expected_offset + count, complete)
    keep = slice(min(skipped, count), None)
    return _columns(buffer, at[keep], fields, keep), result


def _walk(buffer: bytes, data: Bytes, start: int, walk_max: int) -> tuple[Ints, int, bool]:
    """Positions of up to `walk_max` records from `start` whose bytes are all in the
    buffer, the position after them, and decode_records' `complete`: False when the walk
    stopped inside a record.

    Records of one size (common: fixed-size events) are found without a Python loop,
    by `_uniform_run`; the first run shorter than RUN_RECORDS_MIN hands the rest of the
    chunk to `_walk_lengths`.
    """
    runs: list[Ints] = []
    pos = start
    left = walk_max
    while left > 0:
        run = _uniform_run(data, pos, left)
        if len(run) < RUN_RECORDS_MIN:
            rest, pos, complete = _walk_lengths(buffer, pos, left)
            runs.append(np.frombuffer(rest, np.int64))
            return np.concatenate(runs), pos, complete
        runs.append(run)
        left -= len(run)
        pos = 2 * int(run[-1]) - int(run[-2])
    return (np.concatenate(runs) if runs else np.zeros(0, np.int64)), pos, True


def _uniform_run(data: Bytes, pos: int, count_max: int) -> Ints:
    """Positions of the records from `pos` that have the same length as the first, up
    to `count_max`, all wholly in `data`: each candidate position is checked to hold
    that length, so each is where the previous record ends. Vectorised: no Python loop.
    """
    if pos + fmt.RECORD_HEADER_BYTES > len(data):
        return np.zeros(0, np.int64)
    length = int(_u32_at(data, np.array([pos]))[0])
    stride = 4 + length
    if length < fmt.RECORD_LENGTH_MIN:
        return np.zeros(0, np.int64)  # damage: the per-record walk and checks report it
    candidates = pos + stride * np.arange(min(count_max, (len(data) - pos) // stride))
    differs = np.flatnonzero(_u32_at(data, candidates) != length)
    return candidates[: differs[0]] if len(differs) else candidates


def _u32_at(data: Bytes, positions: Ints) -> Ints:
    """The little-endian u32 at each byte position (unaligned gathers through a view
    whose elements start at every byte)."""
    view = np.ndarray((len(data) - 3,), "<u4", data, 0, (1,))
    return view[positions].astype(np.int64)


def _walk_lengths(buffer: bytes, start: int, walk_max: int) -> tuple[array[int], int, bool]:
    """`_walk` one record at a time, for records of varying sizes.

    Hot loop: one unpack and one append per record, measured 0.12 us/record here; every
    other per-record step is a numpy operation over the whole chunk.
    """
    unpack = _LENGTH.unpack_from
    size = len(buffer)
    header_last = size - fmt.RECORD_HEADER_BYTES
    positions = array("q")
    append = positions.append
    pos = start
    for _ in range(walk_max):
        if pos > header_last:
            return positions, pos, pos == size
        end = pos + 4 + unpack(buffer, pos)[0]
        if end > size:
            return positions, pos, False
        append(pos)
        pos = end
    return positions, pos, True


def _gather_fields(data: Bytes, positions: Ints) -> dict[str, Ints]:
    """Every header field of every record, widened to int64.

    A strided view whose rows start at every byte makes each position a 32-byte row, so
    one fancy index copies all the headers; a packed dtype then names the fields."""
    if len(data) < fmt.RECORD_HEADER_BYTES:
        headers = np.zeros(0, _HEADER)
    else:
        rows = np.ndarray(
            (len(data) - fmt.RECORD_HEADER_BYTES + 1, fmt.RECORD_HEADER_BYTES),
            np.uint8,
            data,
            0,
            (1, 1),
        )
        headers = rows[positions].view(_HEADER).reshape(-1)
    # astype copies each field out of the 32-byte rows; a u64 offset past int64 wraps to
    # a negative number, which the dense-offsets check then rejects.
    return {name: headers[name].astype(np.int64) for name, _ in _HEADER_FIELDS}


def _intact(
    data: Bytes, positions: Ints, stop: int, fields: dict[str, Ints], expected: int
) -> bool:
    """Whether every record passes decode_records' checks: lengths, flags, dense offsets
    from `expected`, and all CRCs (one chained CRC32C pass)."""
    count = len(positions)
    if count == 0:
        return True
    length = fields["length"]
    parts = fields["exchange_len"] + fields["routing_key_len"] + fields["properties_len"]
    if (length < fmt.RECORD_LENGTH_MIN).any() or (length - fmt.RECORD_LENGTH_MIN < parts).any():
        return False
    if fields["flags"].any():
        return False
    if not np.array_equal(fields["offset"], np.arange(expected, expected + count)):
        return False
    return crc32c(_crc_chain(data, positions, stop, fields["crc"]).data) == 0


def _crc_chain(data: Bytes, positions: Ints, stop: int, crcs: Ints) -> Bytes:
    """The records from positions[0] to `stop` with each 8-byte (length, crc) prefix
    replaced so that, by `fmt.CRC32C_RESET_WORD`, the CRC32C of the whole is 0 exactly
    when every record's payload has its stored CRC.

    Each record's prefix becomes `previous crc ^ RESET, RESET` (the first record's
    previous crc is 0), and `last crc ^ RESET` is appended: a payload with the right CRC
    leaves CRC32C value v = its crc, the next word brings it back to 0, and RESET keeps
    it there. A record whose CRC is off by e != 0 leaves a non-zero value that the rest
    of the bytes only multiply by powers of x modulo the CRC polynomial (invertible), so
    one damaged record always shows; several can cancel out with probability 2**-32,
    the chance that one damaged record passes its own CRC.
    """
    first = int(positions[0])
    chain = np.empty(stop - first + 4, np.uint8)
    chain[: stop - first] = data[first:stop]
    words = np.ndarray((len(chain) - 3,), "<u4", chain, 0, (1,))
    reset = fmt.CRC32C_RESET_WORD
    relative = positions - first
    words[relative] = np.concatenate(([0], crcs[:-1])) ^ reset
    words[relative + 4] = reset
    words[stop - first] = int(crcs[-1]) ^ reset
    return chain


def _columns(buffer: bytes, positions: Ints, fields: dict[str, Ints], keep: slice) -> RecordColumns:
    return RecordColumns(
        buffer,
        positions,
        positions + 4 + fields["length"][keep],
        fields["offset"][keep],
        fields["timestamp_ms"][keep],
        fields["exchange_len"][keep],
        fields["routing_key_len"][keep],
        fields["properties_len"][keep],
    )


def run_columns(buffer: bytes, positions: Ints) -> RecordColumns:
    """Columns of records our own encoder just wrote back to back in `buffer` (a chunk's
    records in the version-1 form, `chunk_runs`), starting at `positions`: their
    headers gathered, nothing checked (the chunk's CRCs were)."""
    fields = _gather_fields(np.frombuffer(buffer, np.uint8), positions)
    return _columns(buffer, positions, fields, slice(None))
