"""`CRC32C_RESET_WORD` and `crc32c_chain`: the identity the bulk reader's one-pass CRC
check rests on, checked against the crc32c library."""

from __future__ import annotations

import struct

from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from streamq.log import format as fmt


@given(st.integers(0, (1 << 32) - 1))
def test_reset_word_brings_any_crc_value_back_to_zero(value: int) -> None:
    word = struct.pack("<I", value ^ fmt.CRC32C_RESET_WORD)
    assert crc32c(word, value) == 0


@given(st.lists(st.binary(max_size=64), max_size=20))
def test_chain_of_intact_payloads_is_zero(payloads: list[bytes]) -> None:
    assert fmt.crc32c_chain(payloads, [crc32c(p) for p in payloads]) == 0


@given(
    st.lists(st.binary(max_size=64), min_size=1, max_size=20),
    st.data(),
)
def test_one_wrong_crc_always_shows(payloads: list[bytes], data: st.DataObject) -> None:
    crcs = [crc32c(p) for p in payloads]
    i = data.draw(st.integers(0, len(payloads) - 1))
    crcs[i] ^= data.draw(st.integers(1, (1 << 32) - 1))
    assert fmt.crc32c_chain(payloads, crcs) != 0
