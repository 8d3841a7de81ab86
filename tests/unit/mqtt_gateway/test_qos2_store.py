"""The QoS 2 state file (mqtt_gateway/qos2_store.py): round trip, and what it refuses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mqtt_gateway import qos2_store
from mqtt_gateway.qos2_store import Qos2Corrupted, Qos2Store


def test_identifiers_round_trip(tmp_path: Path) -> None:
    store = Qos2Store(str(tmp_path))
    store.add("a", 1)
    store.add("a", 65535)
    store.add("b", 7)
    store.remove("b", 7)
    assert store.dirty
    asyncio.run(store.flush())
    assert not store.dirty
    again = Qos2Store(str(tmp_path))
    assert again.ids == {"a": {1, 65535}}
    assert again.of("a") == {1, 65535} and again.of("b") == set()
    assert again.drop("a") and not again.drop("a")


@pytest.mark.parametrize(
    "data", [b"", b"[]", b'{"a": 1}', b'{"a": [0]}', b'{"a": [65536]}', b'{"a": ["1"]}', b"\xff"]
)
def test_a_bad_file_is_refused(tmp_path: Path, data: bytes) -> None:
    (tmp_path / qos2_store.FILE_NAME).write_bytes(data)
    with pytest.raises(Qos2Corrupted):
        Qos2Store(str(tmp_path))
