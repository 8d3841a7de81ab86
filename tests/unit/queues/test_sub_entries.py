"""Compressed sub-entry batches (streamq/queues/sub_entries.py): every codec's batch is
stored as one record per message, as an uncompressed batch is; what does not decompress
to what it declares is refused and appends nothing."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys

import pytest

from streamq.log import amqp10
from streamq.log._streamwire import encode_publish
from streamq.queues import sub_entries
from streamq.queues.publishers import BadPublish
from tests.unit.queues.test_stream_native import close, open_stream

CODECS = [sub_entries.GZIP, sub_entries.SNAPPY, sub_entries.LZ4, sub_entries.ZSTD]
MESSAGES = [b"one", b"two!" * 50, b"", b"\x00\xff" * 300]


def batch_payload(
    version: int, publishing_id: int, entry: bytes, filter_value: bytes = b""
) -> bytes:
    head = struct.pack(">iQ", 1, publishing_id)
    if version >= 2:
        head += struct.pack(">h", len(filter_value)) + filter_value
    return head + entry


def stored(stream_dir: str, version: int, entry: bytes, filter_value: bytes = b"") -> list[bytes]:
    stream = open_stream(stream_dir)
    try:
        result = stream.append_publish(
            b"ref", version, batch_payload(version, 7, entry, filter_value), 1000
        )
        assert (result.count, result.appended) == (1, len(MESSAGES))
        stream.log.sync_blocking()
        records = list(stream.log.read(0, 100))
        assert all(r.properties == amqp10.native_properties(7) for r in records)
        assert all(r.routing_key == filter_value for r in records)
        return [r.body for r in records]
    finally:
        close(stream)


@pytest.mark.parametrize("codec", CODECS, ids=[sub_entries.NAMES[c] for c in CODECS])
@pytest.mark.parametrize("version", [1, 2])
def test_a_compressed_batch_is_stored_as_its_messages(
    tmp_path: str, codec: int, version: int
) -> None:
    entry = sub_entries.compress(codec, MESSAGES)
    assert (entry[0] >> 4) & 7 == codec
    assert stored(str(tmp_path), version, entry, b"eu" if version == 2 else b"") == MESSAGES


def test_the_c_parser_names_a_compressed_batch_as_the_module_expects() -> None:
    payload = batch_payload(1, 1, sub_entries.compress(sub_entries.GZIP, [b"x"]))
    with pytest.raises(ValueError, match=f"^{sub_entries.COMPRESSED_TEXT}$"):
        encode_publish(1, payload, 0, 0, b"", -1, 1 << 20)


def test_a_jdk_style_gzip_member_decompresses() -> None:
    """The JDK's GZIPOutputStream writes a plain gzip member, as Python's gzip does."""
    plain = b"".join(struct.pack(">I", len(m)) + m for m in MESSAGES)
    assert sub_entries.decompress(sub_entries.GZIP, gzip.compress(plain), len(plain)) == plain


def test_uncompressed_and_compressed_batches_and_simple_entries_mix_in_one_frame(
    tmp_path: str,
) -> None:
    stream = open_stream(str(tmp_path))
    parts = [
        struct.pack(">Q", 1) + struct.pack(">I", 3) + b"abc",
        struct.pack(">Q", 2) + sub_entries.compress(sub_entries.ZSTD, [b"d", b"e"]),
        struct.pack(">Q", 3) + sub_entries.compress(sub_entries.NONE, [b"f"]),
        struct.pack(">Q", 4) + sub_entries.compress(sub_entries.LZ4, [b"g", b"h", b"i"]),
    ]
    result = stream.append_publish(b"", 1, struct.pack(">i", len(parts)) + b"".join(parts), 1000)
    assert (result.count, result.appended) == (4, 7)
    stream.log.sync_blocking()
    assert [r.body for r in stream.log.read(0, 100)] == [b"abc", b"d", b"e", b"f", b"g", b"h", b"i"]
    close(stream)


def refused_entries() -> list[tuple[bytes, str]]:
    plain = struct.pack(">I", 5) + b"hello"
    packed = bytes(sub_entries.codecs()[sub_entries.ZSTD].compress(plain))

    def entry(kind: int, count: int, length: int, data: bytes) -> bytes:
        return struct.pack(">BHII", kind, count, length, len(data)) + data

    bomb = bytes(sub_entries.codecs()[sub_entries.GZIP].compress(b"\x00" * (4 << 20)))
    return [
        (entry(0xD0, 1, len(plain), packed), "unknown sub-entry compression 5"),
        (entry(0xC0, 1, len(plain) - 1, packed), "does not decompress"),
        (entry(0xC0, 1, len(plain) + 1, packed), "decompresses to 9 bytes, not the 10"),
        (entry(0xC0, 1, len(plain), packed[:-2]), "does not decompress"),
        (entry(0xC0, 2, len(plain), packed), "does not hold its messages"),
        (entry(0x90, 1, 1000, bomb), "does not decompress"),
        (entry(0x90, 1, sub_entries.BATCH_BYTES_MAX + 1, bomb), "limit"),
        (entry(0xA0, 1, len(plain), b"not snappy at all"), "does not decompress"),
    ]


@pytest.mark.parametrize(("entry", "reason"), refused_entries())
def test_a_batch_that_does_not_decompress_to_what_it_declares_appends_nothing(
    tmp_path: str, entry: bytes, reason: str
) -> None:
    stream = open_stream(str(tmp_path))
    with pytest.raises(BadPublish, match=reason):
        stream.append_publish(b"ref", 1, batch_payload(1, 1, entry), 1000)
    assert stream.log.next_offset == 0
    close(stream)


@pytest.mark.parametrize("cut", [4, 10, 12, 14, 20, 40])
def test_a_truncated_frame_with_a_compressed_batch_is_refused(tmp_path: str, cut: int) -> None:
    payload = batch_payload(1, 1, sub_entries.compress(sub_entries.SNAPPY, MESSAGES))
    stream = open_stream(str(tmp_path))
    with pytest.raises(BadPublish, match="truncated"):
        stream.append_publish(b"", 1, payload[:cut], 1000)
    assert stream.log.next_offset == 0
    close(stream)


def test_the_broker_imports_no_codec_until_a_compressed_batch_comes() -> None:
    """Memory at rest: cramjam (about 3 MiB mapped) is imported at the first compressed
    batch, not with the broker and its gateways."""
    code = (
        "import sys, streamq.app, stream_gateway.server, http_gateway.server\n"
        "assert 'cramjam' not in sys.modules, 'imported at start'\n"
        "from streamq.queues import sub_entries\n"
        "batch = sub_entries.compress(sub_entries.GZIP, [b'a'])\n"
        "assert 'cramjam' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
