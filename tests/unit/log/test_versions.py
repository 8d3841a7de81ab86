"""Every versioned file kind refuses a newer format version with NewerFormat, naming the
file and both versions, and still reads its own version (streamq/log/versions.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from streamq.broker import definitions, delayed
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
