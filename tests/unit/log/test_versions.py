"""Every versioned file kind refuses a newer format version with NewerFormat, naming the
file and both versions, and still reads its own version (streamq/log/versions.py)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from streamq.broker import definitions, delayed
from streamq.log import format as fmt
from streamq.log._records import crc32c
from streamq.log.errors import SegmentCorrupted
from streamq.log.versions import NewerFormat
from streamq.queues import journal, offset_file, publishers

NEWER = 7


def read_definitions(path: str, version: int) -> object:
    return definitions.decode_file(path, definitions.HEADER.pack(definitions.MAGIC, version, 0))


def read_journal(path: str, version: int) -> object:
    return journal.replay(path, journal.HEADER.pack(journal.MAGIC, version, 0, 0), 0, 0)


def read_offsets(path: str, version: int) -> object:
    return offset_file.decode_file(path, offset_file.HEADER.pack(offset_file.MAGIC, version, 0))


def read_publishers(path: str, version: int) -> object:
    data = publishers.HEADER.pack(publishers.MAGIC, version, 0)
    return publishers.decode_file(path, data)


def read_delayed(path: str, version: int) -> object:
    Path(path).write_bytes(delayed.HEADER.pack(delayed.MAGIC, version, 0))
    store = delayed.DelayedStore.open(path)
    store.close()
    return store


KINDS: dict[str, tuple[Callable[[str, int], object], int]] = {
    "definitions": (read_definitions, definitions.VERSION),
    "queue journal": (read_journal, journal.VERSION),
    "stream offsets": (read_offsets, offset_file.VERSION),
    "stream publishers": (read_publishers, publishers.VERSION),
    "delayed messages": (read_delayed, delayed.VERSION),
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_newer_version_is_refused_naming_both(kind: str, tmp_path: Path) -> None:
    read, current = KINDS[kind]
    path = str(tmp_path / "file")
    read(path, current)  # its own version reads
    with pytest.raises(NewerFormat) as refused:
        read(path, current + NEWER)
    message = str(refused.value)
    assert path in message
    assert f"{kind} format version {current + NEWER} was written by a newer streamq" in message
    assert f"reads {kind} format versions up to {current}" in message
    assert (refused.value.found, refused.value.supported) == (current + NEWER, current)


def test_a_newer_segment_header_is_refused_not_taken_for_damage() -> None:
    header = bytearray(fmt.encode_segment_header(0, 0))
    assert fmt.decode_segment_header(bytes(header), "s.seg") == 0
    struct.pack_into("<H", header, 4, fmt.FORMAT_VERSION_MAX + NEWER - 1)
    damaged = bytes(header)  # the version changed, the CRC not: a flipped bit
    with pytest.raises(SegmentCorrupted, match="unsupported segment format version 8"):
        fmt.decode_segment_header(damaged, "s.seg")
    struct.pack_into("<I", header, 28, crc32c(bytes(header[:28])))  # as a newer streamq
    with pytest.raises(NewerFormat, match=r"s\.seg: segment format version 8 .* up to 2"):
        fmt.decode_segment_header(bytes(header), "s.seg")
