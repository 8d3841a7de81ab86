"""`read_definitions_file` reads at most FILE_BYTES_MAX bytes, in pieces: a file of the
limit is read whole, one byte more is refused, and either way the answer does not depend
on where the pieces end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamq.broker.definitions_import import (
    FILE_BYTES_MAX,
    READ_CHUNK_BYTES,
    DefinitionsInvalid,
    read_definitions_file,
)


def _document_of(size: int) -> bytes:
    """A JSON object of exactly `size` bytes."""
    head = b'{"queues": [], "padding": "'
    tail = b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_a_file_of_the_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(_document_of(FILE_BYTES_MAX))
    document = read_definitions_file(str(path))
    assert document["queues"] == []
    assert len(json.dumps(document["padding"])) == FILE_BYTES_MAX - len(
        b'{"queues": [], "padding": }'
    )


def test_one_byte_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(_document_of(FILE_BYTES_MAX + 1))
    with pytest.raises(DefinitionsInvalid, match=f"larger than {FILE_BYTES_MAX} bytes"):
        read_definitions_file(str(path))


@pytest.mark.parametrize(
    "size", [0, 1, READ_CHUNK_BYTES - 1, READ_CHUNK_BYTES, READ_CHUNK_BYTES + 1]
)
def test_pieces_join_back(tmp_path: Path, size: int) -> None:
    path = tmp_path / "d.json"
    data = _document_of(max(size, 30))
    path.write_bytes(data)
    assert read_definitions_file(str(path)) == json.loads(data)
