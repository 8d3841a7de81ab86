"""The bloom filter of an osiris chunk: which filter values a chunk's entries carry.

Owns osiris_bloom's filter, byte for byte, and nothing else (pure functions; `chunk`
writes and reads the bytes in a chunk). Bit 0 (the most significant bit of byte 0) says
some entry has no filter value; a value sets bits `phash2(v, bits - 1) + 1` and
`phash2([v], bits - 1) + 1`, where phash2 is Erlang's `erlang:phash2/2` (Bob Jenkins'
lookup2 over the term, as erts' make_hash2 computes it for a binary and for a list of
one binary; not murmur3: clients never compute it, they filter messages themselves). A
chunk in which no entry has a value has no filter (0 bytes). tests/unit/log/test_chunk.py
checks the hashes and the layout against `erl`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

BLOOM_SIZE_DEFAULT: Final = 16  # osiris' default filter size in bytes
BLOOM_SIZE_MIN: Final = 16
BLOOM_SIZE_MAX: Final = 255
_M32: Final = 0xFFFFFFFF
_HCONST: Final = 0x9E3779B9  # erts' HCONST (the golden ratio)
_HCONST_2: Final = 0x3C6EF372
_HCONST_13: Final = 0x08D12E65
_NIL_DEF: Final = 2  # erts' tag value of [] (NIL_DEF)
_NIL_FIRST: Final = 3468870702  # make_hash2 of [] met first (never the case here)


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """Bob Jenkins' lookup2 mix, as erts' MIX macro, over 32-bit words."""
    a = (a - b - c) & _M32 ^ (c >> 13)
    b = (b - c - a) & _M32 ^ ((a << 8) & _M32)
    c = (c - a - b) & _M32 ^ (b >> 13)
    a = (a - b - c) & _M32 ^ (c >> 12)
    b = (b - c - a) & _M32 ^ ((a << 16) & _M32)
    c = (c - a - b) & _M32 ^ (b >> 5)
    a = (a - b - c) & _M32 ^ (c >> 3)
    b = (b - c - a) & _M32 ^ ((a << 10) & _M32)
    c = (c - a - b) & _M32 ^ (b >> 15)
    return a, b, c


def _block_hash(data: bytes, initval: int) -> int:
    """erts' block_hash: 12 bytes per round as three little-endian words."""
    a = b = _HCONST
    c = initval
    n, i = len(data), 0
    while n - i >= 12:
        a = (a + int.from_bytes(data[i : i + 4], "little")) & _M32
        b = (b + int.from_bytes(data[i + 4 : i + 8], "little")) & _M32
        c = (c + int.from_bytes(data[i + 8 : i + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
        i += 12
    rest = data[i:] + bytes(12 - (n - i))
    a = (a + int.from_bytes(rest[0:4], "little")) & _M32
    b = (b + int.from_bytes(rest[4:8], "little")) & _M32
    c = (c + n + (int.from_bytes(rest[8:12], "little") << 8)) & _M32  # byte 0 of c: length
    return _mix(a, b, c)[2]


def phash2_binary(value: bytes) -> int:
    """make_hash2 of an Erlang binary (erlang:phash2(Value, R) is this mod R)."""
    return _block_hash(value, _HCONST_13) if value else _HCONST_13


def phash2_list_of_binary(value: bytes) -> int:
    """make_hash2 of `[Value]`: the binary, then the list's tail []."""
    hash_ = phash2_binary(value)
    if hash_ == 0:
        return _NIL_FIRST
    return _mix((_HCONST_2 + _NIL_DEF) & _M32, _HCONST_2, hash_)[2]


def bloom_bits(value: bytes, bloom_size: int) -> tuple[int, int]:
    """osiris_bloom:make_hash: the two bit numbers (1..bits-1) of a filter value; (0, 0)
    for no filter value."""
    if not value:
        return 0, 0
    bits = bloom_size * 8
    return phash2_binary(value) % (bits - 1) + 1, phash2_list_of_binary(value) % (bits - 1) + 1


def bloom_filter(values: Iterable[bytes], bloom_size: int = BLOOM_SIZE_DEFAULT) -> bytes:
    """osiris_bloom:to_binary of the values of a chunk's entries (b"" for an entry
    without one): b"" when no entry has a value, else `bloom_size` bytes."""
    distinct = set(values)
    if not distinct - {b""}:
        return b""
    bloom = bytearray(bloom_size)
    for value in distinct:
        for bit in bloom_bits(value, bloom_size):
            bloom[bit >> 3] |= 0x80 >> (bit & 7)
    return bytes(bloom)


def bloom_may_match(bloom: bytes, values: Iterable[bytes], match_unfiltered: bool) -> bool:
    """osiris_bloom:is_match: may the chunk with filter `bloom` hold an entry a consumer
    with filter `values` (and `match_unfiltered`) takes? False positives are possible,
    false negatives not. A chunk without a filter only holds entries without a value."""
    if not bloom:
        return match_unfiltered
    if match_unfiltered and bloom[0] & 0x80:
        return True
    for value in values:
        if all(bloom[bit >> 3] & (0x80 >> (bit & 7)) for bit in bloom_bits(value, len(bloom))):
            return True
    return False
