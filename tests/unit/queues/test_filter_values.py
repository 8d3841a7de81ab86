"""The stored form of long filter values and references, and the Publish v2 rewrite that
puts it in a frame: every other byte stays, a compressed sub-entry batch included, and
the C parser names the refusal the gateway's fallback looks for."""

from __future__ import annotations

import hashlib
import struct

import pytest

from streamq.log._streamwire import encode_publish
from streamq.queues import filter_values, sub_entries
from tests.unit.queues.test_stream_native import close, open_stream


def entry(publishing_id: int, filter_value: bytes | None, rest: bytes) -> bytes:
    length = -1 if filter_value is None else len(filter_value)
    return struct.pack(">Qh", publishing_id, length) + (filter_value or b"") + rest


def simple(message: bytes) -> bytes:
    return struct.pack(">I", len(message)) + message


def test_short_values_are_stored_as_they_are_and_long_ones_as_their_digest() -> None:
    assert filter_values.stored(b"x" * 255) == b"x" * 255
    long = b"y" * 256
    digest = b"sha256:" + hashlib.sha256(long).hexdigest().encode()
    assert filter_values.stored(long) == digest
    assert len(digest) <= filter_values.RECORD_FIELD_BYTES_MAX
    assert filter_values.forms(b"eu") == (b"eu",)
    assert filter_values.forms(long) == (long, digest)


def test_the_rewrite_replaces_only_long_filter_values() -> None:
    long = b"z" * 20_000
    batch = sub_entries.compress(sub_entries.GZIP, [b"a", b"b"])
    parts = [entry(1, long, simple(b"one")), entry(2, b"eu", simple(b"two")),
             entry(3, None, simple(b"three")), entry(4, long, batch)]  # fmt: skip
    payload = struct.pack(">i", len(parts)) + b"".join(parts)
    want = [entry(1, filter_values.stored(long), simple(b"one")), parts[1], parts[2],
            entry(4, filter_values.stored(long), batch)]  # fmt: skip
    assert filter_values.shorten_publish(payload) == struct.pack(">i", 4) + b"".join(want)


@pytest.mark.parametrize("cut", [1, 5, 9, 12])
def test_a_truncated_payload_is_refused(cut: int) -> None:
    payload = struct.pack(">i", 1) + entry(1, b"q" * 300, simple(b"m"))
    with pytest.raises(ValueError):
        filter_values.shorten_publish(payload[:-cut])


def test_the_c_parser_refuses_a_long_filter_value_with_the_text_the_fallback_expects() -> None:
    payload = struct.pack(">i", 1) + entry(1, b"q" * 256, simple(b"m"))
    with pytest.raises(ValueError, match=f"^{filter_values.LONG_FILTER_TEXT}$"):
        encode_publish(2, payload, 0, 0, b"", -1, 1 << 20)


def test_a_rewritten_frame_is_stored_with_the_digest_as_its_filter_value(tmp_path: str) -> None:
    long = b"w" * 1000
    payload = struct.pack(">i", 1) + entry(5, long, simple(b"body"))
    stream = open_stream(str(tmp_path))
    try:
        result = stream.append_publish(b"", 2, filter_values.shorten_publish(payload), 1000)
        assert result.appended == 1
        stream.log.sync_blocking()
        (record,) = stream.log.read(0, 10)
        assert (record.routing_key, record.body) == (filter_values.stored(long), b"body")
    finally:
        close(stream)
