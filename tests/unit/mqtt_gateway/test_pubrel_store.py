"""The PUBREL state file (mqtt_gateway/pubrel_store.py): round trip, a removal that
names another delivery, and what it refuses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mqtt_gateway import pubrel_store
from mqtt_gateway.pubrel_store import PubrelCorrupted, PubrelStore


def test_entries_round_trip(tmp_path: Path) -> None:
    store = PubrelStore(str(tmp_path))
    store.add("a", 1, ("mqtt-subscription-aqos2", 10))
    store.add("a", 65535, ("mqtt-shared-g", 0))
    store.add("b", 7, ("q", 3))
    store.remove("b", 7, ("q", 3))
    asyncio.run(store.flush())
    again = PubrelStore(str(tmp_path))
    assert again.entries == {"a": {1: ("mqtt-subscription-aqos2", 10), 65535: ("mqtt-shared-g", 0)}}
    assert again.of("b") == {}
    # What the file held when opened: offered again, skipped (consumer.py).
    assert again.recovered == {("mqtt-subscription-aqos2", 10), ("mqtt-shared-g", 0)}
    assert store.recovered == set()  # a store opened on no file recovered nothing
    assert again.drop("a") and not again.drop("a")


def test_a_removal_of_an_identifier_used_again_keeps_the_new_entry(tmp_path: Path) -> None:
    store = PubrelStore(str(tmp_path))
    store.add("a", 1, ("q", 10))
    store.add("a", 1, ("q", 11))  # PUBCOMP'd, then PUBREC'd again for another message
    store.remove("a", 1, ("q", 10))  # the first one's late removal
    assert store.of("a") == {1: ("q", 11)}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"a": []}',
        b'{"a": {"0": ["q", 1]}}',
        b'{"a": {"65536": ["q", 1]}}',
        b'{"a": {"x": ["q", 1]}}',
        b'{"a": {"1": ["q"]}}',
        b'{"a": {"1": [1, 1]}}',
        b'{"a": {"1": ["q", -1]}}',
        b"\xff",
    ],
)
def test_a_bad_file_is_refused(tmp_path: Path, data: bytes) -> None:
    (tmp_path / pubrel_store.FILE_NAME).write_bytes(data)
    with pytest.raises(PubrelCorrupted):
        PubrelStore(str(tmp_path))
